"""How the metric functions reduce per-example values: ``"mean"`` (NaN-aware) or ``"none"``."""

from __future__ import annotations

import torch

REDUCTIONS = ("mean", "none")


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    check_reduction(reduction)
    return values.nanmean() if reduction == "mean" else values
