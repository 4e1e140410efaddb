"""Argument checks shared by the ops: each raises an error that names the argument,
the offending value and what is allowed."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache
from typing import SupportsIndex, cast

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_float(name: str, t: torch.Tensor) -> None:
    check_tensor(name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}")


def check_rank(name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in present.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_tau(tau: float) -> float:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)):
        raise TypeError(f"tau must be a float in (0, 1], got {type(tau).__name__}")
    if not (0.0 < float(tau) <= 1.0):
        raise ValueError(f"tau must lie in (0, 1], got {tau}")
    return float(tau)


def num_kept(tau: float, d: int) -> int:
    """``k = max(1, floor(tau · d))``: how many of ``d`` features a group keeps, computed exactly with
    ``tau`` read as the decimal it prints as (``0.29 · 100`` keeps 29, where floating point gives
    28.999999999999996 and would keep 28)."""
    return max(1, math.floor(Fraction(repr(float(tau))) * d))


@lru_cache(maxsize=64)
def num_kept_table(tau: float, d: int) -> tuple[int, ...]:
    """``num_kept(tau, c)`` for every count ``c`` in ``[0, d]`` (per-row ``k`` from valid counts)."""
    return tuple(num_kept(tau, c) for c in range(d + 1))


def check_grid(grid: object, d: int) -> tuple[int, int]:
    """A feature grid ``(h, w)``: two positive integers with ``h · w = d``."""
    try:
        # ``grid`` is unchecked input: a non-iterable raises the TypeError caught below.
        h, w = (operator.index(side) for side in cast(Iterable[SupportsIndex], grid))
    except (TypeError, ValueError):
        raise ValueError(f"grid must be two positive integers (h, w) with h · w = d={d}, got {grid!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"grid sides must be positive integers, got {grid!r}")
    if h * w != d:
        raise ValueError(f"grid {(h, w)} has {h * w} cells but logits have d={d} features")
    return h, w


def rows_without_result(logits: torch.Tensor, valid: torch.Tensor | None = None, blurred: bool = False) -> torch.Tensor:
    """``[N]`` bool: rows of ``logits [N, d]`` with no softmax, sparsemax or top-τ — a NaN among the
    ``valid`` entries, or every valid entry ``−inf``.  With ``blurred`` (a blur mixes each entry with
    its neighbours, valid or not) any NaN or infinity in the row counts."""
    if blurred:
        return ~torch.isfinite(logits).all(dim=-1)
    nan = torch.isnan(logits)
    above = logits > float("-inf")
    if valid is not None:
        nan, above = nan & valid, above & valid
    return nan.any(dim=-1) | ~above.any(dim=-1)
