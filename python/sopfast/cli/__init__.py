"""The ``sopfast`` command line — what this room owns: the parser and its one-line errors (``app.py``),
value types and config files (``parser.py``), flags generated from the Python API (``options.py``), the flags
and steps the subcommands share (``common.py``: model source, data, device), and one module per subcommand
(``commands/``).  It calls the Python API and computes nothing of its own."""

from .app import build_parser, main
from .parser import CLIError

__all__ = ["CLIError", "build_parser", "main"]
