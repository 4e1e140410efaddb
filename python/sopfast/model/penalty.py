"""SOP's opt-in training terms beyond the paper's loss (``docs/quality.md``) and the output that adds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..types import FeatureInputs, Groups
from .losses import attention_overlap, mean_saliency, saliency_alignment, saliency_kl
from .output import SOPOutput


@dataclass
class RegularisedOutput(SOPOutput):
    """An :class:`SOPOutput` whose :meth:`loss` adds a training ``penalty`` (``SOP(diversity_weight=...)``)."""

    penalty: torch.Tensor | None = None

    def compute_loss(self, labels: torch.Tensor) -> torch.Tensor:
        loss = super().compute_loss(labels)
        return loss if self.penalty is None else loss + self.penalty


def training_penalty(model: Any, inputs: FeatureInputs, groups: Groups, tau: float | None = None) -> torch.Tensor:
    """The scalar added to the loss of ``model`` (a :class:`sopfast.SOP`) in training:
    ``diversity_weight ·`` the attention overlap of ``groups`` ``+ saliency_weight ·`` the
    ``saliency_loss`` to the backbone's saliency averaged over ``saliency_levels`` (default: ``z = τ``);
    both weights are 0 in the ``"paper"`` recipe."""
    valid = model.adapter.candidates(inputs)
    penalty = groups.lam.new_zeros(())
    if model.diversity_weight > 0:
        penalty = penalty + model.diversity_weight * attention_overlap(groups.attention, valid)
    if model.saliency_weight > 0 and inputs.batch_size > 0:
        levels = model.saliency_levels or (model.tau if tau is None else tau,)
        saliency = mean_saliency(model, inputs, levels)
        if model.saliency_loss == "kl":
            term = saliency_kl(groups.attention, saliency, valid, model.generator.scale)
        else:
            term = saliency_alignment(groups.attention, saliency, valid)
        penalty = penalty + model.saliency_weight * term
    return penalty
