"""The argument parser of ``sopfast``: one-line errors, value types, and config files read as flags.

Every subcommand takes ``--config FILE`` (YAML or JSON with the same keys as the long flags,
dashes or underscores); its values become command-line tokens, so they are parsed and checked
exactly like flags, and flags given on the command line win over the file.  A ``NAME=VALUE`` flag
(``--label-map``, ``--backbone-option``) takes a mapping there.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any


class CLIError(Exception):
    """A bad argument, a missing file, unreadable data: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes raise :class:`CLIError` (one line) instead of printing usage;
    ``subcommands`` maps each subcommand to its parser."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.subcommands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        raise CLIError(f"{message} (see '{self.prog} --help')")


# -- value types ------------------------------------------------------------------------------------
def int_at_least(minimum: int) -> Callable[[str], int]:
    """An ``argparse`` type: an integer ≥ ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer ≥ {minimum}, got {value}")
        return value

    parse.__name__ = f"integer ≥ {minimum}"
    return parse


def integer(text: str) -> int:
    """An ``argparse`` type: any integer (the API checks its range)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def fraction(text: str) -> float:
    """An ``argparse`` type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def key_value(text: str) -> tuple[str, Any]:
    """An ``argparse`` type: ``NAME=VALUE`` with the value read as JSON when it parses (numbers,
    true/false, lists), else as a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return name.strip(), value


# -- config files -----------------------------------------------------------------------------------
def load_config(path: str) -> dict[str, Any]:
    """The mapping in config file ``path`` (YAML by extension, else JSON)."""
    if not os.path.exists(path):
        raise CLIError(f"--config file not found: {path}")
    if not os.path.isfile(path):
        raise CLIError(f"--config {path} is not a file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise CLIError(f"--config {path} cannot be read: {err}") from err
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise CLIError(f"--config {path} is not valid YAML: {' '.join(str(err).split())}") from err
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CLIError(f"--config {path} is not valid JSON: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CLIError(f"--config {path} must hold a mapping of option names to values, got {type(data).__name__}")
    return data


def config_tokens(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """The options of config file ``path`` as command-line tokens for ``parser`` (so they are
    parsed and checked like flags); keys are long flags or destinations, dashes or underscores."""
    by_name: dict[str, tuple[argparse.Action, str, bool]] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if not longs or action.dest in ("help", "config", "debug"):
            continue
        for flag in longs:
            by_name[flag[2:].replace("-", "_")] = (action, flag, True)
        by_name.setdefault(action.dest, (action, longs[0], False))
    tokens, unknown = [], []
    for key, value in load_config(path).items():
        name = str(key).replace("-", "_")
        if name not in by_name:
            unknown.append(str(key))
            continue
        action, flag, by_flag = by_name[name]
        tokens += _tokens_for(action, flag, by_flag, key, value, path)
    if unknown:
        raise CLIError(f"--config {path}: unknown option(s) {sorted(unknown)}")
    return tokens


def _tokens_for(action: argparse.Action, flag: str, by_flag: bool, key: Any, value: Any, path: str) -> list[str]:
    where = f"--config {path}: {key!r}"
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise CLIError(f"{where} must be true or false, got {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag if value else f"--no-{flag[2:]}"]
        return [flag] if value == (True if by_flag else action.const) else []
    if value is None:
        return []
    if isinstance(action, argparse._AppendAction):
        items = [f"{k}={json.dumps(v)}" for k, v in value.items()] if isinstance(value, dict) else value
        if not isinstance(items, list):
            items = [items]
        return [token for item in items for token in (flag, str(item))]
    if action.type is key_value and action.nargs in ("+", "*") and isinstance(value, (dict, list)):  # --label-map
        pairs = value.items() if isinstance(value, dict) else value  # a list of pairs: sopfast <= 0.5.3 wrote it
        if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            raise CLIError(f"{where} must be a mapping of NAME: VALUE, got {value!r}")
        return [flag, *(f"{k}={json.dumps(v)}" for k, v in pairs)]
    if isinstance(value, bool) and getattr(action.type, "takes_bool", False):  # e.g. compile: yes, no or auto
        return [f"{flag}={'yes' if value else 'no'}"]
    if isinstance(value, (dict, bool)):
        raise CLIError(
            f"{where} must be a {'list of values' if action.nargs in ('+', '*') else 'value'}, got {value!r}"
        )
    if isinstance(value, list):
        if action.nargs not in ("+", "*"):
            raise CLIError(f"{where} takes one value, got a list {value!r}")
        if any(isinstance(v, (dict, list, bool)) or v is None for v in value):
            raise CLIError(f"{where} must be a list of plain values, got {value!r}")
        return [flag, *map(str, value)]
    return [f"{flag}={value}"] if action.nargs not in ("+", "*") else [flag, str(value)]


def config_path(argv: list[str]) -> str | None:
    """The ``--config`` value in ``argv`` (the last one wins), if any."""
    path = None
    for i, token in enumerate(argv):
        if token == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif token.startswith("--config="):
            path = token.split("=", 1)[1]
    return path
