"""The frozen backbone under masks — what this room owns: running a backbone on many masked copies of its
inputs (:func:`masked_forward`, the engine under SOP's group passes and every perturbation explainer), the
one registry of explainers by name (:data:`EXPLAINERS`: Captum's methods on :class:`MaskedForward`, RISE
(:func:`rise`), Integrated Gradients), the one random-group sampler (:func:`random_groups`), how far an
explainer moves between two modes (:func:`agreement`), how well the backbone predicts from groups of its
features (:func:`diagnose`, what a SOP training run measures first) and the opt-in fine-tuning of a copy
under random masking (:func:`adapt_backbone`)."""

from .adapt import AdaptResult, adapt_backbone
from .agreement import Agreement, agreement
from .captum import MaskedForward
from .diagnose import Diagnosis, diagnose
from .explainers import EXPLAINERS, Explainer, get_explainer, register_explainer
from .forward import MaskedOutputs, UnfaithfulModeWarning, explainer_mode, masked_forward, run_masked
from .random_groups import random_group_scores, random_groups
from .rise import rise, rise_masks

__all__ = [
    "EXPLAINERS",
    "AdaptResult",
    "Agreement",
    "Diagnosis",
    "Explainer",
    "MaskedForward",
    "MaskedOutputs",
    "UnfaithfulModeWarning",
    "adapt_backbone",
    "agreement",
    "diagnose",
    "explainer_mode",
    "get_explainer",
    "masked_forward",
    "random_group_scores",
    "random_groups",
    "register_explainer",
    "rise",
    "rise_masks",
    "run_masked",
]
