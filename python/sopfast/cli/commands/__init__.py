"""One module per ``sopfast`` subcommand, each with ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (:data:`COMMANDS` lists them in the order ``sopfast --help`` shows)."""

from . import adapt, bench, convert, demo, diagnose, evaluate, explain, predict, theory, train

COMMANDS = (demo, diagnose, adapt, train, evaluate, explain, predict, bench, convert, theory)

__all__ = ["COMMANDS"]
