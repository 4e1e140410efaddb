"""Evaluation: the paper's metrics, the baselines, and :func:`evaluate`, which runs both on SOP's
group-execution path."""

from . import baselines, metrics
from .evaluate import evaluate, format_table

__all__ = ["baselines", "evaluate", "format_table", "metrics"]
