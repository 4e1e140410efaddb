"""Files written all-or-nothing, and the training state (``training_state.pt``): one ``torch.save`` file
written atomically (a temporary file in the same directory, ``fsync``, then ``os.replace``) whose
``sha256`` entry is the SHA-256 of every other entry's values (:func:`sopfast.integrity.state_sha256`),
verified when it is read; states of sopfast 0.3.0 hold none and are read without.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from ..integrity import check_version, state_sha256
from ..version import __version__

STATE_NAME = "training_state.pt"
_TEMP_FILE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> Path:
    """Write ``path`` all-or-nothing: ``write(f)`` fills a temp file that replaces ``path`` once synced
    (what ``write`` returns, e.g. ``f.write``'s byte count, is ignored)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (POSIX only; a no-op elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temp_files(directory: str | os.PathLike) -> list[Path]:
    """Delete the temp files :func:`atomic_write` left in ``directory`` (and its subfolders) when its
    process was killed; files of a process that is still running stay.  Returns what was removed."""
    directory = Path(directory)
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for path in directory.rglob(".*.tmp"):
        match = _TEMP_FILE.match(path.name)
        if match and path.is_file() and not _pid_alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj, path)``, atomically."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def save_training_state(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write a training state atomically with its ``sha256`` (over the values of every other entry) and the
    sopfast version."""
    sealed = {k: v for k, v in state.items() if k != "sha256"}
    sealed["sopfast_version"] = __version__
    sealed["sha256"] = state_sha256(sealed)
    return atomic_save(sealed, path)


def load_training_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a training-state file written by :func:`save_training_state` (tensors land on the CPU),
    verifying its ``sha256`` and version where recorded (a ValueError naming the file)."""
    path = Path(path)
    if path.is_dir():
        path = path / STATE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no training state to resume from: {path!s} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, unpickling error, ...
        raise ValueError(f"{path} is not a readable training state ({type(err).__name__}: {err})") from err
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a sopfast training state")
    if "sha256" in state:
        rest = {k: v for k, v in state.items() if k != "sha256"}
        if state["sha256"] != state_sha256(rest):
            raise ValueError(
                f"{path} does not match its recorded SHA-256: the training state is corrupted or was changed "
                "after saving; resume from another state or start afresh (resume=False, --no-resume)"
            )
    if "sopfast_version" in state:
        check_version(state["sopfast_version"], str(path), __version__)
    return state
