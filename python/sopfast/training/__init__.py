"""SOP training, and nothing else — what this room owns: :func:`train` / :class:`Trainer` (AMP, checkpoints,
exact resume, DDP under torchrun, early stopping), its configuration, records and callbacks.  The backbone
diagnostic a run starts with and the opt-in adaptation of a backbone copy are tools of the frozen backbone
under masks (:mod:`sopfast.masking`)."""

from .callbacks import TrainerCallback
from .config import TrainConfig, TrainResult
from .trainer import NonFiniteLossError, Trainer, train

__all__ = [
    "NonFiniteLossError",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainerCallback",
    "train",
]
