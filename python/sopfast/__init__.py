"""sopfast: fast Sum-of-Parts self-attributing models."""

from . import ops

__version__ = "0.1.0"
