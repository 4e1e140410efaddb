"""The ``sopfast`` command line: ``demo``, ``train``, ``evaluate``, ``explain``, ``bench``, ``convert``, ``theory``.

Each subcommand is a module of :mod:`sopfast.cli.commands`; their model, training and evaluation
flags are generated from the Python API (:mod:`sopfast.cli.options`).  Every subcommand takes
``--config FILE`` (:mod:`sopfast.cli.parser`).  Mistakes end with one line on stderr and exit
status 2 (``--debug`` shows the traceback instead).  Only the subcommand that runs is imported
(``sopfast --version`` and ``sopfast --help`` import no torch), and heavy packages only where it
needs them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from types import ModuleType

from ..version import __version__
from .commands import COMMANDS, load
from .parser import CLIError, Parser, config_path, config_tokens

# errors whose message is the whole story (no type name in front of it)
PLAIN_ERRORS = (CLIError, ValueError, TypeError, FileNotFoundError, ImportError)


def build_parser(commands: Iterable[str] | None = None) -> Parser:
    """The ``sopfast`` parser, every subcommand with its flags; with ``commands``, only those get their
    flags (the others are listed, for ``--help``, without importing their modules)."""
    parser = Parser(prog="sopfast", description="Fast Sum-of-Parts self-attributing models.", allow_abbrev=False)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--version", action="version", version=f"sopfast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, text in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=text, allow_abbrev=False)
        if commands is None or name in commands:
            _add_flags(p, load(name))
            parser.subcommands[name] = p
    return parser


def _add_flags(p: Parser, command: ModuleType) -> None:
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    loudness = p.add_mutually_exclusive_group()
    loudness.add_argument("--verbose", action="store_true", help="more progress messages (debug level)")
    loudness.add_argument("--quiet", action="store_true", help="only warnings and errors on stderr")
    command.add_arguments(p)
    p.set_defaults(handler=command.run)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, or 2 after a one-line error on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    prog = "sopfast"
    try:
        at = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
        command = argv[at] if at is not None and argv[at] in COMMANDS else None
        parser = build_parser([] if command is None else [command])
        if at is not None and command is not None:
            config = config_path(argv[at + 1 :])
            if config is not None:
                argv = [*argv[: at + 1], *config_tokens(parser.subcommands[command], config), *argv[at + 1 :]]
            prog = f"sopfast {command}"
        args = parser.parse_args(argv)
        from .common import configure_logging

        configure_logging(1 if args.verbose else -1 if args.quiet else 0)
        return int(args.handler(args) or 0)
    except KeyboardInterrupt as stop:  # a command may say how to continue (the interrupt's message)
        print(f"{prog}: interrupted" + (f"; {stop}" if str(stop) else ""), file=sys.stderr)
        return 130
    except Exception as err:  # every failure is one line (the traceback with --debug)
        if debug:
            raise
        text = _one_line(err)
        if not isinstance(err, PLAIN_ERRORS):
            text = f"{type(err).__name__}: {text} (rerun with --debug for the traceback)"
        print(f"{prog}: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
