"""Command-line flags generated from the Python API, so the two cannot drift.

Each flag is a keyword parameter of a function or constructor (``sopfast.SOP``, ``sopfast.train``'s
:class:`~sopfast.training.config.TrainConfig`, ``sopfast.evaluate`` …): its name with dashes, its
type and default from the signature (``Literal`` annotations give the choices, ``bool`` gives
``--name/--no-name``), its help from the docstring's ``Args:`` section.  The values are checked by
the API itself when the command calls it, so a flag and a keyword argument are checked alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Union

from ..checks import finite_float
from .parser import integer

_ARGS_HEADER = re.compile(r"^\s*Args:\s*$")
_ROLE = re.compile(r":\w+:`~?([^`]+)`")
_ARG_LINE = re.compile(r"^(\s*)([\w, ]+?):\s(.*)$")


def docstring_args(obj: Any) -> dict[str, str]:
    """The ``Args:`` section of ``obj``'s docstring (class or function) as ``{name: text}``; a line
    ``a, b: text`` documents both."""
    doc = inspect.getdoc(obj) or ""
    init = getattr(obj, "__init__", None) if isinstance(obj, type) else None
    if init is not None and init.__doc__:
        doc += "\n" + (inspect.getdoc(init) or "")
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if _ARGS_HEADER.match(line)), None)
    if start is None:
        return {}
    found: dict[str, str] = {}
    names: list[str] = []
    indent: int | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        match = _ARG_LINE.match(line)
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break
        if match and depth == indent:
            names = [n.strip() for n in match.group(2).split(",")]
            for name in names:
                found[name] = match.group(3).strip()
        elif names:
            for name in names:
                found[name] += " " + line.strip()
    return found


def _hints(target: Any) -> dict[str, Any]:
    """The evaluated annotations of ``target``; one that names something imported only for type
    checking (a forward reference that does not resolve) counts as ``Any``."""
    try:
        return typing.get_type_hints(target)
    except NameError:
        namespace = {**vars(typing), **getattr(inspect.getmodule(target), "__dict__", {})}
        hints = {}
        for name, text in getattr(target, "__annotations__", {}).items():
            try:
                hints[name] = eval(text, namespace) if isinstance(text, str) else text
            except (NameError, TypeError):
                hints[name] = Any
        return hints


def plain(text: str) -> str:
    """Docstring markup as plain text for ``--help`` (``code`` and :role:`name` lose their marks)."""
    return " ".join(_ROLE.sub(r"\1", text).replace("``", "").split())


def parameters(api: Callable | type) -> dict[str, tuple[Any, Any]]:
    """Keyword parameters of ``api`` as ``{name: (annotation, default)}`` (a dataclass: its fields)."""
    if dataclasses.is_dataclass(api):
        hints = _hints(api)
        return {
            f.name: (hints[f.name], f.default if f.default is not dataclasses.MISSING else None)
            for f in dataclasses.fields(api)
        }
    target = getattr(api, "__init__") if isinstance(api, type) else api  # noqa: B009 - a class's own __init__
    hints = _hints(target)
    out = {}
    for name, p in inspect.signature(target).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is inspect.Parameter.empty:
            continue
        out[name] = (hints.get(name, Any), p.default)
    return out


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` → ``(X, True)``; anything else → ``(annotation, False)``."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True  # noqa: UP007 - a runtime Union
    return annotation, False


def argument(annotation: Any, default: Any) -> dict[str, Any] | None:
    """``argparse.add_argument`` keywords for a parameter, or ``None`` when it has no command-line form
    (tensors, modules, callables)."""
    base, optional = _strip_optional(annotation)
    origin = typing.get_origin(base)
    if base is bool:
        return {"action": argparse.BooleanOptionalAction, "default": default}
    words = [w for a in typing.get_args(base) if typing.get_origin(a) is Literal for w in typing.get_args(a)]
    if bool in typing.get_args(base) and words:  # bool | Literal[...]: yes, no or one of the words
        return {"type": _bool_or(words), "default": default, "metavar": "{" + ",".join(["yes", "no", *words]) + "}"}
    if origin is Literal:
        return {"choices": typing.get_args(base), "default": default}
    if base in (int, float):
        parse = integer if base is int else finite_float
        metavar = "N" if base is int else "X"
        if optional:
            return {"type": _or_none(parse), "default": default, "metavar": f"{{{metavar},none}}"}
        return {"type": parse, "default": default, "metavar": metavar}
    if base is str or str in typing.get_args(base):  # str, or a union such as str | os.PathLike
        return {"default": default}
    if origin in (list, tuple, Sequence, Iterable) or origin is typing.get_origin(Iterable[int]):
        item = typing.get_args(base)[0] if typing.get_args(base) else str
        item, _ = _strip_optional(item)
        if typing.get_origin(item) is Literal:
            return {"nargs": "+", "choices": typing.get_args(item), "default": _listed(default)}
        kind = {int: integer, float: finite_float}.get(item)
        if kind is None and item is not str:
            return None
        return {"nargs": "+", "type": kind or str, "default": _listed(default)}
    return None


def _bool_or(words: list[str]) -> Callable[[str], Any]:
    """A parser of ``yes``/``no`` (``true``/``false``) as a bool, and of each of ``words`` as itself."""

    def parse(text: str) -> Any:
        word = text.strip().lower()
        if word in words:
            return word
        if word in ("yes", "true", "no", "false"):
            return word in ("yes", "true")
        raise argparse.ArgumentTypeError(f"expected yes, no or {', '.join(words)}, got {text!r}")

    parse.__name__ = "yes, no or " + ", ".join(words)
    parse.takes_bool = True  # type: ignore[attr-defined]  # config files may give true/false
    return parse


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, or ``None`` for the word ``none`` (an optional number switched off)."""

    def parse_or_none(text: str) -> Any:
        return None if text.strip().lower() == "none" else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value") + " or none"
    return parse_or_none


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "yes" if default else "no"
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


def _listed(default: Any) -> Any:
    return list(default) if isinstance(default, (tuple, list)) else default


def flag(name: str) -> str:
    """The long flag of parameter ``name``."""
    return "--" + name.replace("_", "-")


def add_api_options(
    group: argparse._ActionsContainer,
    api: Callable | type,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
    given_only: bool = False,
    help_prefix: str = "",
    shown_defaults: dict[str, str] | None = None,
) -> list[str]:
    """Add a flag for every keyword parameter of ``api`` (``only`` those named, none of ``skip``, none
    the container already has) and return their destinations.  ``defaults`` replaces signature
    defaults; with ``given_only`` a flag that is not given leaves its name out of the namespace (the
    API's own default then applies; the help still shows it).  ``shown_defaults`` describes a default
    in words where the command chooses it."""
    docs = docstring_args(api)
    params = parameters(api)
    names = list(params) if only is None else [n for n in only if n in params]
    existing = {a.dest for a in group._actions}
    added = []
    for name in names:
        if name in skip or name in existing:
            continue
        annotation, default = params[name]
        kwargs = argument(annotation, default)
        if kwargs is None:
            continue
        if defaults and name in defaults:
            kwargs["default"] = defaults[name]
        shown = kwargs["default"]
        if given_only and not (defaults and name in defaults):
            kwargs["default"] = argparse.SUPPRESS
        text = plain(docs.get(name, ""))
        if shown_defaults and name in shown_defaults:
            suffix = f" (default: {shown_defaults[name]})"
        else:
            suffix = "" if shown is None else f" (default: {_shown(shown)})"
        kwargs["help"] = (help_prefix + text + suffix).replace("%", "%%")
        group.add_argument(flag(name), dest=name, **kwargs)
        added.append(name)
    return added


def api_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The values of ``names`` that the namespace holds (a suppressed default: absent)."""
    return {name: getattr(args, name) for name in names if hasattr(args, name)}
