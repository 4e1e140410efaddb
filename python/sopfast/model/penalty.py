"""SOP's opt-in training terms beyond the paper's loss (``docs/quality.md``) and the output that adds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..types import FeatureInputs, Groups
from .losses import (
    attention_overlap,
    distillation_loss,
    full_prediction,
    mean_saliency,
    saliency_alignment,
    saliency_kl,
    sufficiency_loss,
)
from .output import SOPOutput


@dataclass
class RegularisedOutput(SOPOutput):
    """An :class:`SOPOutput` whose :meth:`loss` adds training penalties (``SOP(diversity_weight=...)``):
    ``penalty_terms`` by name (``"diversity"``, ``"saliency"``, ``"sufficiency"``, ``"distill"``), ``penalty``
    their sum."""

    penalty_terms: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def penalty(self) -> torch.Tensor | None:
        """The scalar the penalties add to the loss (``None`` without any)."""
        terms = list(self.penalty_terms.values())
        return None if not terms else sum(terms[1:], terms[0])

    def compute_loss(self, labels: torch.Tensor) -> torch.Tensor:
        loss = super().compute_loss(labels)
        return loss if self.penalty is None else loss + self.penalty

    def loss_terms(self, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {**super().loss_terms(labels), **{f"{k}_penalty": v for k, v in self.penalty_terms.items()}}


def training_penalty(
    model: Any, inputs: FeatureInputs, groups: Groups, out: SOPOutput, tau: float | None = None
) -> dict[str, torch.Tensor]:
    """The terms added to the loss of ``model`` (a :class:`sopfast.SOP`) in training, by name:
    ``"diversity"``, ``diversity_weight ·`` the attention overlap of ``groups``; ``"saliency"``,
    ``saliency_weight ·`` the ``saliency_loss`` to the backbone's saliency averaged over ``saliency_levels``
    (default: ``z = τ``); ``"sufficiency"`` and ``"distill"``, their weights times
    :func:`~sopfast.model.losses.sufficiency_loss` and :func:`~sopfast.model.losses.distillation_loss` of the
    prediction ``out`` (whose ``backbone_logits`` the forward computed).  A term whose weight is 0 (all, in
    the ``"paper"`` recipe) is left out."""
    valid = model.adapter.candidates(inputs)
    reference = out.backbone_logits
    terms: dict[str, torch.Tensor] = {}
    if model.diversity_weight > 0:
        terms["diversity"] = model.diversity_weight * attention_overlap(groups.attention, valid)
    if inputs.batch_size == 0 or reference is None:
        return terms
    if model.saliency_weight > 0:
        levels = model.saliency_levels or (model.tau if tau is None else tau,)
        saliency = mean_saliency(model, inputs, levels, full_prediction(model, inputs, reference))
        if model.saliency_loss == "kl":
            term = saliency_kl(groups.attention, saliency, valid, model.generator.scale)
        else:
            term = saliency_alignment(groups.attention, saliency, valid)
        terms["saliency"] = model.saliency_weight * term
    if model.sufficiency_weight > 0:
        terms["sufficiency"] = model.sufficiency_weight * sufficiency_loss(out.group_logits, groups.lam, reference)
    if model.distill_weight > 0:
        terms["distill"] = model.distill_weight * distillation_loss(out.logits, reference)
    return terms
