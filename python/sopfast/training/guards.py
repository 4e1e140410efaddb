"""What stops a run before it writes a model that cannot run: NaN or infinite weights and optimizer
state (checked before every save and when a state is resumed), and the message for a run whose updates
diverged (naming the step and ``lr``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..integrity import listed, non_finite


class NonFiniteLossError(ValueError):
    """Training stopped: the loss (or, without a gradient scaler, the gradient norm), the weights or the
    optimizer state became NaN or infinite; nothing computed after that step was saved."""


def check_savable(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, lr: float) -> None:
    """Raise :class:`NonFiniteLossError` naming the tensors when ``model``'s weights or ``optimizer``'s state
    hold NaN or ±Inf (one host read per tensor)."""
    bad = non_finite({"model": dict(model.named_parameters()), "optimizer": optimizer.state_dict()})
    if bad:
        raise NonFiniteLossError(
            f"training stopped at step {step} (lr {lr:g}): NaN or infinite values in {listed(bad)}; nothing of "
            "this step was saved. Lower lr or turn on grad_clip"
        )


def check_optimizer_state(path: Path, state: dict[str, Any]) -> None:
    """A resumed optimizer state must be finite (its NaN would be written into the weights next step)."""
    bad = non_finite(state)
    if bad:
        raise ValueError(
            f"cannot resume from {path}: the optimizer state holds NaN or infinite values in {listed(bad)}"
        )


def diverged(where: str, err: Exception, model: torch.nn.Module, step: int, lr: float) -> NonFiniteLossError:
    """The error for values that became NaN or infinite after ``step`` updates: the weights that did (the
    updates diverged), or ``err`` itself; with ``lr`` and what to change."""
    bad = non_finite(dict(model.named_parameters()))
    advice = f"lower lr (now {lr:g}) or turn on grad_clip"
    if bad:
        return NonFiniteLossError(
            f"{where}: the weights {listed(bad)} became NaN or infinite after {step} updates at lr {lr:g}: the "
            f"updates diverged; {advice}"
        )
    return NonFiniteLossError(
        f"{where}, after {step} updates at lr {lr:g}: {err}; if the inputs are in range, {advice}"
    )
