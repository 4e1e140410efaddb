"""The learning-rate schedule every training loop of sopfast uses (:func:`sopfast.train`, and
:func:`sopfast.adapt_backbone`'s fine-tuning): linear warm-up, then cosine, inverse square root or constant."""

from __future__ import annotations

import math
from collections.abc import Callable

SCHEDULES = ("cosine", "inverse_sqrt", "constant")


def lr_factor(schedule: str, warmup: int, total: int, period: int | None = None) -> Callable[[int], float]:
    """The learning-rate multiplier of step ``s`` (0-based): linear warm-up, then ``schedule``.

    With ``period`` the schedule restarts every ``period`` steps (``total`` is then one period).
    """

    def factor(step: int) -> float:
        if period is not None:
            step %= period
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule == "inverse_sqrt":
            base = max(1, warmup)
            return math.sqrt(base / (step - warmup + base))
        return 1.0

    return factor
