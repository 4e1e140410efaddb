"""How many features a group keeps, which rows have no result, and how NaN ranks: rules every op
backend shares."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import torch

from ..checks import check_int, check_tau


@torch.compiler.assume_constant_result  # host arithmetic on constants: torch.compile takes its value
def num_kept(tau: float, d: int) -> int:
    """``k = max(1, floor(tau · d))``: how many of ``d`` features a group keeps, computed exactly with
    ``tau`` read as the decimal it prints as (``0.29 · 100`` keeps 29, where floating point gives
    28.999999999999996 and would keep 28)."""
    return max(1, math.floor(Fraction(repr(check_tau(tau))) * check_int("d", d, 0)))


@lru_cache(maxsize=64)
def num_kept_table(tau: float, d: int) -> tuple[int, ...]:
    """``num_kept(tau, c)`` for every count ``c`` in ``[0, d]`` (per-row ``k`` from valid counts)."""
    return tuple(num_kept(tau, c) for c in range(d + 1))


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


def canonical_for_sort(x: torch.Tensor) -> torch.Tensor:
    """``x`` with every NaN the positive quiet NaN and ``−0`` as ``+0``, so that every sort ranks it alike:
    the CPU's comparison sort ranks any NaN above ``+inf`` and ``−0 == +0``, while CUDA's radix sort
    orders the raw bits (torch 2.11: rows up to 4,096 values), where a NaN with the sign bit set lies
    below ``−inf``.  A sort of ``x`` needs this on every device to give one answer."""
    return torch.where(torch.isnan(x), torch.full_like(x, float("nan")), x + 0.0)
