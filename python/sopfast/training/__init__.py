"""Training: :func:`train` / :class:`Trainer` (AMP, checkpoints, exact resume, DDP under torchrun), the
backbone diagnostic run before it (:func:`diagnose`) and the opt-in masking adaptation of a backbone copy
(:func:`adapt_backbone`)."""

from .adapt import AdaptResult, adapt_backbone
from .callbacks import TrainerCallback
from .config import TrainConfig, TrainResult
from .diagnose import Diagnosis, diagnose
from .trainer import NonFiniteLossError, Trainer, train

__all__ = [
    "AdaptResult",
    "Diagnosis",
    "NonFiniteLossError",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainerCallback",
    "adapt_backbone",
    "diagnose",
    "train",
]
