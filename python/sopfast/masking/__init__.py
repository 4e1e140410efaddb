"""Masked inference: a frozen backbone on many masked copies of its inputs (:func:`masked_forward`),
Captum's perturbation explainers on it (:class:`MaskedForward`) and RISE (:func:`rise`)."""

from .captum import MaskedForward
from .forward import MaskedOutputs, masked_forward, run_masked
from .rise import rise, rise_masks

__all__ = ["MaskedForward", "MaskedOutputs", "masked_forward", "rise", "rise_masks", "run_masked"]
