"""Files written all-or-nothing, model folders that never overwrite a model sopfast was not told to
replace, and the training state (``training_state.pt``): one ``torch.save`` file written atomically (a
temporary file in the same directory, ``fsync``, then ``os.replace``) whose ``sha256`` entry is the
SHA-256 of every other entry's values (:func:`sopfast.integrity.state_sha256`), verified when it is read;
required from sopfast 0.4 on, states of 0.3.0 hold none and are read without.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import torch

from ..integrity import CHECKSUMS_FROM, check_version, fsync_directory, listed, state_sha256, temp_name
from ..integrity import atomic_write as atomic_write
from ..version import __version__

STATE_NAME = "training_state.pt"
_TEMP_FILE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")
#: The suffixes of weights files (Hugging Face, timm, torchvision, pickled modules, ONNX, GGUF …).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".pkl")
#: The other files of a saved model: configs, and the processor's and the tokenizer's files.
MODEL_NAMES = frozenset(
    {"config.json", "sop_config.json", "sopfast_adaptation.json", "preprocessor_config.json", "generation_config.json"}
)
MODEL_PREFIXES = ("tokenizer", "special_tokens", "vocab", "merges")
#: A model's card: replaced with the model it describes, never written over in a folder without a model.
CARD_NAME = "README.md"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(paths: Iterable[Path]) -> list[Path]:
    """Delete those of ``paths`` that are temp files or folders of a process that is gone."""
    removed = []
    for path in paths:
        match = _TEMP_FILE.match(path.name)
        if match is None or _pid_alive(int(match["pid"])):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def remove_stale_temp_files(directory: str | os.PathLike) -> list[Path]:
    """Delete the temp files :func:`atomic_write` and the temp folders :func:`write_model_folder` left in
    ``directory`` (and its subfolders) when their process was killed; those of a process that is still
    running stay.  Returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return _remove_stale(sorted(directory.rglob(".*.tmp"), key=lambda p: len(p.parts)))


def move_aside(path: str | os.PathLike) -> Path:
    """Rename the (damaged) file ``path`` to ``<name>.damaged-<n>``, the first ``n`` free; returns the new path."""
    path = Path(path)
    n = 1
    while path.with_name(f"{path.name}.damaged-{n}").exists():
        n += 1
    aside = path.with_name(f"{path.name}.damaged-{n}")
    os.replace(path, aside)
    return aside


# -- model folders ---------------------------------------------------------------------------------
def is_model_file(name: str) -> bool:
    """Whether a file named ``name`` belongs to a saved model: weights, a config, processor or tokenizer
    files (a training state and temp files do not)."""
    if name == STATE_NAME or _TEMP_FILE.match(name):
        return False
    return (
        name.endswith(WEIGHT_SUFFIXES)
        or name.endswith(".index.json")
        or name in MODEL_NAMES
        or name.startswith(MODEL_PREFIXES)
    )


def model_files(directory: str | os.PathLike) -> list[str]:
    """The names of the model files at the top of ``directory``, sorted (none when it is no folder)."""
    path = Path(directory)
    return sorted(p.name for p in path.iterdir() if is_model_file(p.name)) if path.is_dir() else []


def same_folder(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` are the same existing folder or file (symlinks resolved, the same inode)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_model_folder(
    directory: str | os.PathLike,
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    own: Collection[str] = (),
    name: str = "output_dir",
    flag: str = "overwrite=True",
) -> Path:
    """``directory`` as a place to write a model, else a ValueError naming it as ``name``: it is one of
    the ``inputs``' folders (refused whatever ``overwrite``: the model a copy is made from is never
    written), no folder, or holds model files other than ``own`` (the files a re-save replaces) and
    ``overwrite`` (named ``flag``) is not given."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} {path} exists and is not a folder")
    for source in inputs:
        if same_folder(path, source):
            raise ValueError(
                f"{name} {path} is the folder of the model it is made from ({source}): sopfast never writes "
                f"there, not even with {flag}; choose a new folder"
            )
    found = [f for f in model_files(path) if f not in own]
    if found and not overwrite:
        raise ValueError(
            f"{name} {path} already holds a model ({listed(found)}), which sopfast does not write over: choose "
            f"a new folder, or pass {flag} to replace it"
        )
    return path


def write_model_folder(
    directory: str | os.PathLike,
    write: Callable[[Path], object],
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    own: Collection[str] = (),
    name: str = "output_dir",
    flag: str = "overwrite=True",
) -> Path:
    """Write a model folder all-or-nothing, after :func:`check_model_folder` (the same arguments):
    ``write(folder)`` fills a new temporary folder next to ``directory``, synced, which then takes its
    place.  A new or empty ``directory`` is one rename; one that holds a model has its model files and
    ``README.md`` replaced by one swap of folders, its other files kept (hard links); into one without a
    model the files move one by one, configs last, and a file of its own that one would replace is refused
    without ``overwrite``.  Returns the folder."""
    inputs = list(inputs)
    check_model_folder(directory, overwrite=overwrite, inputs=inputs, own=own, name=name, flag=flag)
    target = Path(os.path.realpath(directory))
    cwd = Path.cwd().resolve()
    if model_files(target) and (cwd == target or target in cwd.parents):
        raise ValueError(f"{name} {target} holds the current folder, which cannot be replaced: run from another one")
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(target.parent.glob(f".{target.name}.*.tmp"))
    tmp = temp_name(target)
    tmp.mkdir()
    try:
        write(tmp)
        _sync_files(tmp)
        if not target.exists() or not any(target.iterdir()):
            os.replace(tmp, target)
        elif model_files(target):
            _swap(tmp, target)
        else:
            _move_in(tmp, target, overwrite, name, flag)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    fsync_directory(target.parent)
    return target


def _sync_files(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _swap(tmp: Path, target: Path) -> None:
    """Replace the folder ``target`` (which holds a model) by ``tmp``; what ``target`` holds besides its model
    files and card, and ``tmp`` does not, is hard-linked into ``tmp`` first."""
    for entry in target.iterdir():
        if not is_model_file(entry.name) and entry.name != CARD_NAME and not (tmp / entry.name).exists():
            _link(entry, tmp / entry.name)
    aside = temp_name(target)
    os.rename(target, aside)
    os.rename(tmp, target)
    shutil.rmtree(aside)


def _link(source: Path, destination: Path) -> None:
    """``source`` at ``destination`` as hard links (a folder: its tree), else copies."""

    def link(src: Any, dst: Any) -> None:
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst, follow_symlinks=False)

    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, destination, symlinks=True, copy_function=link)
    else:
        link(source, destination)


def _move_in(tmp: Path, target: Path, overwrite: bool, name: str, flag: str) -> None:
    """Move ``tmp``'s entries into ``target`` (a folder without a model), configs last."""
    entries = sorted(tmp.iterdir(), key=lambda p: (p.name.endswith("config.json"), p.name))
    taken = [e.name for e in entries if (target / e.name).exists()]
    if taken and not overwrite:
        raise ValueError(
            f"{name} {target} already holds {listed(taken)}, which sopfast did not write: choose a new folder, "
            f"or pass {flag} to replace them"
        )
    for entry in entries:
        if (target / entry.name).is_dir() and not (target / entry.name).is_symlink():
            shutil.rmtree(target / entry.name)
        os.replace(entry, target / entry.name)


# -- the training state ----------------------------------------------------------------------------
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
    verifying its version and ``sha256`` (required from sopfast 0.4 on; a ValueError naming the file)."""
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
    version = check_version(state["sopfast_version"], str(path), __version__) if "sopfast_version" in state else None
    if "sha256" in state:
        rest = {k: v for k, v in state.items() if k != "sha256"}
        if state["sha256"] != state_sha256(rest):
            raise ValueError(
                f"{path} does not match its recorded SHA-256: the training state is corrupted or was changed "
                "after saving; resume from another state or start afresh (resume=False, --no-resume)"
            )
    elif version is not None and version[:2] >= CHECKSUMS_FROM:
        raise ValueError(
            f"{path} holds no sha256 entry, which sopfast {state['sopfast_version']} writes into every training "
            "state: its checksum was removed, so it cannot prove itself; resume from another state or start "
            "afresh (resume=False, --no-resume)"
        )
    return state
