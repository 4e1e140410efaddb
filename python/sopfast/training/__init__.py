"""Training: :func:`train` / :class:`Trainer` (AMP, checkpoints, exact resume, DDP under torchrun)."""

from .trainer import NonFiniteLossError, Trainer, TrainResult, train

__all__ = ["NonFiniteLossError", "TrainResult", "Trainer", "train"]
