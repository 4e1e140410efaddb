"""The ``sopfast`` command line (see :mod:`sopfast.cli.app`)."""

from .app import build_parser, main
from .parser import CLIError

__all__ = ["CLIError", "build_parser", "main"]
