"""Your own maps for regression (``--data FOLDER``): a folder of ``.npy`` arrays and one CSV that names
them with their targets, e.g. weak-lensing convergence maps and the (Ω_m, σ_8) they were simulated with::

    maps/
      targets.csv        file,Omega_m,sigma_8          (optionally a split column)
      map_0000.npy       [H, W] or [C, H, W] numbers, in the units the backbone takes
      ...

``file`` names each map, relative to the folder; every other column but ``split`` is a target, in the
CSV's order (``columns`` — the CLI's ``--label-column a,b`` — picks and orders them).  A ``split`` column
(``train`` / ``validation`` / ``test``) assigns rows; without one the rows are cut as other data of one
split is: a held-out test part, then a validation part of the rest (``holdout`` of the rows each, a
permutation with seed 0, so every command cuts alike; maps are not stratified).  Maps are read as they
are: no resizing and no normalisation.  A CSV with only a ``file`` column is unlabelled data (what
``sopfast predict`` reads; training refuses it).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .labels import DataError

FILE_COLUMN = "file"
SPLIT_COLUMN = "split"
SPLITS = {"train": "train", "validation": "val", "val": "val", "test": "test"}
HOLDOUT_SEED = 0


def is_map_folder(path: str) -> bool:
    """Whether ``path`` is a folder holding ``.npy`` files next to a CSV (this module's layout)."""
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    return any(n.lower().endswith(".npy") for n in names) and any(n.lower().endswith(".csv") for n in names)


class MapDataset(torch.utils.data.Dataset):
    """Maps read on access: items ``(x [C, H, W] float32, y [T] float32)`` (``(x,)`` without targets);
    ``sources`` the files, ``target_names`` the target columns."""

    def __init__(self, files: Sequence[str], targets: torch.Tensor | None, target_names: Sequence[str]):
        self.sources = list(files)
        self.targets = targets
        self.target_names = list(target_names)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        x = read_map(self.sources[index])
        return (x,) if self.targets is None else (x, self.targets[index])


def read_map(path: str) -> torch.Tensor:
    """``[C, H, W]`` float32 from a ``.npy`` file of ``[H, W]`` or ``[C, H, W]`` real numbers; a DataError
    (a ValueError) naming the file otherwise."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DataError(f"map {path}: cannot be read as a .npy array ({err})") from err
    if array.ndim not in (2, 3) or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise DataError(
            f"map {path}: expected [H, W] or [C, H, W] real numbers, got shape {array.shape} of {array.dtype}"
        )
    x = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    return x.unsqueeze(0) if x.dim() == 2 else x


@dataclass
class _Rows:
    files: list[str]
    targets: list[list[float]] | None
    splits: list[str] | None


def _table(folder: str) -> str:
    tables = sorted(n for n in os.listdir(folder) if n.lower().endswith(".csv"))
    if len(tables) != 1:
        raise DataError(f"--data {folder}: a map folder holds one CSV naming its maps and targets, found {tables}")
    return os.path.join(folder, tables[0])


def _read_rows(folder: str, target_columns: Sequence[str] | None) -> tuple[_Rows, list[str], str]:
    path = _table(folder)
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    if FILE_COLUMN not in columns:
        raise DataError(f"{path} has no {FILE_COLUMN!r} column naming the .npy maps; columns: {columns}")
    if not rows:
        raise DataError(f"{path} holds no rows")
    names = [c for c in columns if c not in (FILE_COLUMN, SPLIT_COLUMN)]
    if target_columns is not None:
        missing = [c for c in target_columns if c not in names]
        if missing:
            raise DataError(f"{path} has no target column {missing[0]!r} (--label-column); targets: {names}")
        names = list(target_columns)
    files = [os.path.join(folder, row[FILE_COLUMN]) for row in rows]
    targets = [[_number(path, i, row, c) for c in names] for i, row in enumerate(rows)] if names else None
    splits = None
    if SPLIT_COLUMN in columns:
        splits = [SPLITS.get(row[SPLIT_COLUMN].strip().lower(), "") for row in rows]
        bad = next((i for i, s in enumerate(splits) if not s), None)
        if bad is not None:
            raise DataError(
                f"{path} row {bad + 2}: split {rows[bad][SPLIT_COLUMN]!r} is not one of train, validation, test"
            )
    return _Rows(files, targets, splits), names, path


def _number(path: str, index: int, row: dict, column: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise DataError(f"{path} row {index + 2}: target {column!r} must be a finite number, got {text!r}")
    return value


def _positions(rows: _Rows, role: str, holdout: float | None) -> tuple[list[int], str]:
    """The rows of ``role`` and a line naming them (module docstring)."""
    n = len(rows.files)
    if rows.splits is not None:
        named = {r: [i for i, s in enumerate(rows.splits) if s == r] for r in ("train", "val", "test")}
        if role == "test" or named["val"] or holdout is None:
            if not named[role]:
                raise DataError(f"no {role} rows: the split column names none")
            return named[role], f"{role} rows of the split column ({len(named[role])} of {n})"
        rest, held = _cut(named["train"], holdout)
        if role == "val":
            return held, f"validation part held out of the train rows ({len(held)} of {len(named['train'])}, seed 0)"
        return rest, f"train rows without the validation part ({len(rest)} of {len(named['train'])}, seed 0)"
    if holdout is None:
        return list(range(n)), f"all {n} rows"
    rest, test = _cut(list(range(n)), holdout)
    if role == "test":
        return test, f"held-out test part ({len(test)} of {n}, seed 0)"
    train, val = _cut(rest, holdout)
    if role == "val":
        return val, f"validation part held out of the {len(rest)} left after the test part ({len(val)}, seed 0)"
    return train, f"training part ({len(train)} of {n}: the test and validation parts held out, seed 0)"


def _cut(positions: list[int], fraction: float) -> tuple[list[int], list[int]]:
    """``positions`` in two: the rest and a held-out ``fraction`` (at least one, at most all but one)."""
    if len(positions) < 2:
        raise DataError(f"{len(positions)} map(s) left: too few to hold out a part")
    held = min(len(positions) - 1, max(1, round(len(positions) * fraction)))
    order = np.random.default_rng(HOLDOUT_SEED).permutation(len(positions))
    chosen = set(order[:held].tolist())
    rest = [p for i, p in enumerate(positions) if i not in chosen]
    return rest, [p for i, p in enumerate(positions) if i in chosen]


def load_maps(
    folder: str,
    role: str,
    holdout: float | None,
    limit: int | None = None,
    target_columns: Sequence[str] | None = None,
) -> tuple[MapDataset, str]:
    """The ``role`` (``"train"``, ``"val"``, ``"test"``) maps of ``folder`` (module docstring), the first
    ``limit`` of them, and a line naming them."""
    rows, names, path = _read_rows(folder, target_columns)
    positions, text = _positions(rows, role, holdout)
    if limit is not None and limit < len(positions):
        positions, text = positions[:limit], text + f", the first {limit}"
    missing = [rows.files[i] for i in positions if not os.path.isfile(rows.files[i])]
    if missing:
        raise DataError(f"{path} names {len(missing)} map(s) that do not exist, e.g. {missing[0]}")
    targets = None if rows.targets is None else torch.tensor([rows.targets[i] for i in positions], dtype=torch.float32)
    what = f"targets {', '.join(names)}" if names else "no targets"
    dataset = MapDataset([rows.files[i] for i in positions], targets, names)
    return dataset, f"{text}; {what}"
