"""sopfast: fast Sum-of-Parts self-attributing models."""

from . import masking, ops
from .adapters import BackboneAdapter, get_adapter, list_adapters, register_adapter
from .evaluation import baselines, evaluate, format_table, metrics
from .masking import MaskedForward, masked_forward, rise
from .model import SOP, SOPOutput
from .prediction import PredictResult, predict
from .training import Trainer, TrainerCallback, TrainResult, adapt_backbone, diagnose, train
from .version import __version__

__all__ = [
    "SOP",
    "BackboneAdapter",
    "MaskedForward",
    "PredictResult",
    "SOPOutput",
    "TrainResult",
    "Trainer",
    "TrainerCallback",
    "__version__",
    "adapt_backbone",
    "baselines",
    "diagnose",
    "evaluate",
    "format_table",
    "get_adapter",
    "list_adapters",
    "masked_forward",
    "masking",
    "metrics",
    "ops",
    "predict",
    "register_adapter",
    "rise",
    "train",
]
