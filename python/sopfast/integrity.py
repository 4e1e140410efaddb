"""What makes a saved file trustworthy: SHA-256 checksums (of a file's bytes, and of a nested training
state's values), the sopfast version that wrote it, and finite values.

A training state's checksum is computed over its *values* (every tensor's dtype, shape and bytes, every
number, string and key, in a fixed order), so it proves the state that :func:`torch.load` returns is the
one that was saved, whatever the zip container around it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:[.-]?(?:a|b|rc|dev|post)\d*)*(?:\+[\w.]+)?$")


def sha256_bytes(data: bytes) -> str:
    """The SHA-256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def update_with_tensor(digest: Any, tensor: torch.Tensor) -> None:
    """Feed ``tensor``'s dtype, shape and bytes (on the CPU, contiguous) into ``digest``."""
    t = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest.update(f"{t.dtype}|{tuple(tensor.shape)}|".encode())
    digest.update(t.view(torch.uint8).numpy().tobytes())


def _update(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        digest.update(b"T")
        update_with_tensor(digest, value)
    elif isinstance(value, Mapping):
        digest.update(f"D{len(value)}|".encode())
        for key in sorted(value, key=repr):
            _update(digest, key)
            _update(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)}|".encode())
        for item in value:
            _update(digest, item)
    elif isinstance(value, (str, bytes)):
        data = value.encode() if isinstance(value, str) else value
        digest.update(f"{'S' if isinstance(value, str) else 'B'}{len(data)}|".encode() + data)
    else:  # None, bool, int, float (repr is exact for floats)
        digest.update(f"{type(value).__name__}:{value!r}|".encode())


def state_sha256(state: Any) -> str:
    """SHA-256 over the values of a nested state (dicts, lists, tuples, tensors, numbers, strings)."""
    digest = hashlib.sha256()
    _update(digest, state)
    return digest.hexdigest()


def parse_version(text: Any, where: str) -> tuple[int, int, int]:
    """``"0.3.0"`` (``"0.4.0.dev1"``, ``"1.2"`` …) as ``(major, minor, patch)``; ValueError naming ``where``."""
    match = _VERSION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{where}: sopfast_version {text!r} is not a version number (major.minor.patch)")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def check_version(text: Any, where: str, installed: str) -> tuple[int, int, int]:
    """The version ``text`` recorded in ``where``; a ValueError when it is not a version or when its major
    or minor number is newer than the ``installed`` sopfast's (a newer minor version may save what this one
    cannot read or computes differently: ``docs/training.md``, "Checkpoints that prove themselves")."""
    saved = parse_version(text, where)
    if saved[:2] > parse_version(installed, "sopfast")[:2]:
        raise ValueError(
            f"{where} was saved by sopfast {text}, newer than the installed {installed}: upgrade sopfast "
            "(pip install -U sopfast) to load it"
        )
    return saved


def listed(names: Iterable[str], shown: int = 5) -> str:
    """``['a', 'b']`` — at most ``shown`` names, then how many more."""
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{names[:shown]}{more}"


def non_finite(tensors: Mapping[str, Any]) -> list[str]:
    """The names of the floating tensors among ``tensors``' values (nested mappings and sequences
    searched, names joined with ``.``) that hold NaN or ±Inf."""
    found: list[str] = []

    def visit(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and value.numel() and not bool(torch.isfinite(value).all()):
                found.append(name)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(f"{name}.{key}" if name else str(key), item)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{name}.{i}" if name else str(i), item)

    visit("", tensors)
    return found
