"""Training: :func:`train` / :class:`Trainer` (AMP, checkpoints, exact resume, DDP under torchrun)."""

from .callbacks import TrainerCallback
from .config import TrainConfig, TrainResult
from .trainer import NonFiniteLossError, Trainer, train

__all__ = ["NonFiniteLossError", "TrainConfig", "TrainResult", "Trainer", "TrainerCallback", "train"]
