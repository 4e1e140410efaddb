"""Masked inference: a frozen backbone on many masked copies of its inputs (:func:`masked_forward`),
Captum's perturbation explainers on it (:class:`MaskedForward`), RISE (:func:`rise`), and how far an
explainer moves between two modes (:func:`agreement`)."""

from .agreement import Agreement, agreement
from .captum import MaskedForward
from .forward import MaskedOutputs, UnfaithfulModeWarning, explainer_mode, masked_forward, run_masked
from .rise import rise, rise_masks

__all__ = [
    "Agreement",
    "MaskedForward",
    "MaskedOutputs",
    "UnfaithfulModeWarning",
    "agreement",
    "explainer_mode",
    "masked_forward",
    "rise",
    "rise_masks",
    "run_masked",
]
