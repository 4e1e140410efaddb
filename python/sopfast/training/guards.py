"""What stops a run before it writes a model that cannot run: NaN or infinite weights and optimizer
state (checked before every save and when a state is resumed), and the message for a run whose updates
diverged (naming the step and ``lr``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checks import NonFiniteError
from ..integrity import listed, non_finite


class NonFiniteLossError(ValueError):
    """Training stopped: the loss (or, without a gradient scaler, the gradient norm), the weights or the
    optimizer state became NaN or infinite; nothing computed after that step was saved."""


def check_savable(trainer: Any) -> None:
    """Raise :class:`NonFiniteLossError` unless the loss, the gradients (``trainer.check_finite``), the weights
    and the optimizer state of ``trainer`` (a :class:`~sopfast.training.Trainer`) are finite: no model that
    cannot predict is saved (one host read per tensor, per save)."""
    trainer.check_finite()
    bad = non_finite({"model": dict(trainer.model.named_parameters()), "optimizer": trainer.optimizer.state_dict()})
    if bad:
        raise NonFiniteLossError(
            f"training stopped at step {trainer.step} (lr {trainer.config.lr:g}): NaN or infinite values in "
            f"{listed(bad)}; nothing of this step was saved. Lower lr or turn on grad_clip"
        )


def check_optimizer_state(path: Path, state: dict[str, Any]) -> None:
    """A resumed optimizer state must be finite (its NaN would be written into the weights next step)."""
    bad = non_finite(state)
    if bad:
        raise ValueError(
            f"cannot resume from {path}: the optimizer state holds NaN or infinite values in {listed(bad)}"
        )


def step_error(trainer: Any, err: ValueError) -> ValueError:
    """``err``, raised inside a training step of ``trainer``, as the error naming the step; values that became
    NaN or infinite after some updates (:class:`~sopfast.checks.NonFiniteError`) name the weights that did (the
    updates diverged) and ``lr``."""
    where = f"training step {trainer.step + 1} (epoch {trainer.epoch + 1})"
    if not isinstance(err, NonFiniteError) or trainer.step == 0:
        return ValueError(f"{where}: {err}")
    lr, step = trainer.config.lr, trainer.step
    bad = non_finite(dict(trainer.model.named_parameters()))
    advice = f"lower lr (now {lr:g}) or turn on grad_clip"
    if bad:
        return NonFiniteLossError(
            f"{where}: the weights {listed(bad)} became NaN or infinite after {step} updates at lr {lr:g}: the "
            f"updates diverged; {advice}"
        )
    return NonFiniteLossError(f"{where}, after {step} updates at lr {lr:g}: {err}; if the inputs are fine, {advice}")
