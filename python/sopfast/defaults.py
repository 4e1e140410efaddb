"""The defaults of the data options and the batch size, in one place: the Python API (:mod:`sopfast.data`,
:mod:`sopfast.adapters.preprocessing`) and the command line's flags read them here."""

from __future__ import annotations

#: The fraction of a single-split dataset held out for validation or testing (``--holdout``).
HOLDOUT = 0.1
#: Tokens per text, at most (``--max-length``; also at most the backbone's positions).
MAX_LENGTH = 128
#: Examples per batch of ``sopfast.train``, ``sopfast train`` and ``sopfast evaluate`` (``--batch-size``).
BATCH_SIZE = 32
