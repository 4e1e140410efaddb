"""What makes a saved file trustworthy: written all-or-nothing (a temporary file in the same folder,
``fsync``, then ``os.replace``), SHA-256 checksums (of a file's bytes, and of a nested training state's
values), the sopfast version that wrote it, and finite values.

A training state's checksum is computed over its *values* (every tensor's dtype, shape and bytes, every
number, string and key, in a fixed order), so it proves the state that :func:`torch.load` returns is the
one that was saved, whatever the zip container around it.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import torch

#: The first sopfast version whose every checkpoint and training state holds its SHA-256 checksums: from it on
#: they are required (older files, which never had them, load without).
CHECKSUMS_FROM = (0, 4)
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:[.-]?(?:a|b|rc|dev|post)\d*)*(?:\+[\w.]+)?$")


def temp_name(path: Path) -> Path:
    """A fresh temporary name next to ``path`` (``.<name>.<pid>.<8 hex>.tmp``), which
    :func:`sopfast.model.state_files.remove_stale_temp_files` recognises once its process is gone."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> Path:
    """Write ``path`` all-or-nothing: ``write(f)`` fills a temp file that replaces ``path`` once synced
    (what ``write`` returns, e.g. ``f.write``'s byte count, is ignored)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` all-or-nothing (:func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` all-or-nothing (:func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def save_figure(figure: Any, path: str | os.PathLike, dpi: int) -> Path:
    """``figure.savefig(path, dpi=dpi)`` (a matplotlib figure) all-or-nothing, in the format of
    ``path``'s suffix."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    return atomic_write(path, lambda f: figure.savefig(f, format=fmt, dpi=dpi))


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX only; a no-op elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
