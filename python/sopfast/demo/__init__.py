"""``sopfast demo`` — what this room owns: the image demo (``run.py``), the text demo (``text.py``), what both
share (``shared.py``), the demo's small backbones (``backbones.py``) and its printed tables (``report.py``)."""
