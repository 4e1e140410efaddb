"""sopfast: fast Sum-of-Parts self-attributing models.

The public names and the subpackages (``sopfast.ops``, ``sopfast.explain`` …) are imported on first
use: ``sopfast.SOP`` imports torch and the model then, so ``import sopfast`` — and ``sopfast
--version`` or ``sopfast --help`` — imports no torch.  The ops join ``torch.ops.sopfast`` when
:mod:`sopfast.ops` is imported (``from sopfast import ops``, or any use of a model).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from . import masking, ops
    from .adapters import BackboneAdapter, get_adapter, list_adapters, register_adapter
    from .evaluation import baselines, evaluate, format_table, metrics
    from .masking import MaskedForward, adapt_backbone, diagnose, masked_forward, rise
    from .model import SOP, SOPOutput
    from .prediction import PredictResult, predict
    from .training import Trainer, TrainerCallback, TrainResult, train

# each public name that is not a submodule → the subpackage that defines it
_SOURCES = {
    "MaskedForward": ".masking",
    "masked_forward": ".masking",
    "rise": ".masking",
    "BackboneAdapter": ".adapters",
    "get_adapter": ".adapters",
    "list_adapters": ".adapters",
    "register_adapter": ".adapters",
    "baselines": ".evaluation",
    "evaluate": ".evaluation",
    "format_table": ".evaluation",
    "metrics": ".evaluation",
    "SOP": ".model",
    "SOPOutput": ".model",
    "PredictResult": ".prediction",
    "predict": ".prediction",
    "Trainer": ".training",
    "TrainerCallback": ".training",
    "TrainResult": ".training",
    "adapt_backbone": ".masking",
    "diagnose": ".masking",
    "train": ".training",
}


def __getattr__(name: str) -> Any:
    """A public name or a submodule, imported now (and kept)."""
    if name in _SOURCES:
        value = getattr(importlib.import_module(_SOURCES[name], __name__), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
