"""Data — what this room owns: the built-in offline datasets (``builtin.py``), your own data from files and
folders (``user_data.py``, ``folders.py``, ``datasets.py``, ``splits.py``, ``labels.py``), object masks for grounding,
the batch parser every loop reads batches with (``batches.py``), which examples a limited run takes
(``sampling.py``), and what identifies a dataset for a resume or a prediction run (``identity.py``)."""
