"""One module per ``sopfast`` subcommand, each with ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (:data:`COMMANDS` lists them in the order ``sopfast --help`` shows)."""

from . import bench, convert, demo, evaluate, explain, predict, theory, train

COMMANDS = (demo, train, evaluate, explain, predict, bench, convert, theory)

__all__ = ["COMMANDS"]
