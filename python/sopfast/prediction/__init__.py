"""``sopfast.predict``: a whole dataset through SOP (or a backbone and a perturbation explainer) into
a Parquet dataset — sharded, resumable, split over ``torchrun`` processes (docs/predict.md)."""

from .columns import DEFAULT_OUTPUTS, OUTPUTS
from .explainers import EXPLAINERS
from .run import PredictResult, predict

__all__ = ["DEFAULT_OUTPUTS", "EXPLAINERS", "OUTPUTS", "PredictResult", "predict"]
