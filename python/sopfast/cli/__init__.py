"""The ``sopfast`` command line (see :mod:`sopfast.cli.app`)."""

from .app import main

__all__ = ["main"]
