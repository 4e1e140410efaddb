"""``python -m sopfast.cli``: the ``sopfast`` command without the entry point."""

import sys

from . import main

sys.exit(main())
