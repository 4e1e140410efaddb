"""The SOP model: generator, selector, output, losses, saving and loading, the authors' checkpoints
and the plain reference implementation of their algorithm."""

from .output import SOPOutput
from .sop import SOP

__all__ = ["SOP", "SOPOutput"]
