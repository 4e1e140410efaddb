"""A trained SOP measured with its own groups beside the backbone diagnostic (:func:`sopfast.diagnose` on a
model): its accuracy, its agreement with the backbone's full-input prediction, and where it loses agreement."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.agreement import group_bounds
from ..model.sop import SOP
from ..types import FeatureInputs


@dataclass
class OwnGroups:
    """A (trained) SOP model on the same examples with its own groups, in its mode: its accuracy, its
    agreement with the backbone's full-input prediction, and where it loses — the generator bound (some
    group alone makes the backbone predict what it predicts on the whole input), the selector bound (the
    accuracy of the label-free rule "the first agreeing group, else the most confident"), the share of
    single groups that agree, and the selector's misses (a group agrees, SOP does not)
    (:func:`sopfast.evaluation.metrics.group_bounds`)."""

    accuracy: float
    agreement: float
    generator_bound: float
    selector_bound: float
    one_group_agrees: float
    selector_misses: float | None = None  # None: read from a diagnosis saved before sopfast 0.6.2

    def lines(self, mode: str) -> list[str]:
        """The measurements, and which part of SOP loses, in words."""
        out = [
            f"  this SOP with its own groups in {mode}: accuracy {self.accuracy:.3f}, agrees with the backbone on "
            f"{self.agreement:.1%} of the examples",
            f"  some group of its own alone agrees with the backbone on {self.generator_bound:.1%} (generator "
            f"bound); one group on {self.one_group_agrees:.1%}; the first agreeing group is right on "
            f"{self.selector_bound:.1%} (selector bound, accuracy)",
        ]
        if self.selector_misses is not None and self.selector_misses > 0.05:
            out.append(
                f"  the selector loses: on {self.selector_misses:.1%} of the examples a group agrees with the "
                "backbone but SOP's prediction does not (agreement_prior weights the groups that agree)"
            )
        if self.generator_bound < 0.9:
            out.append(
                f"  the groups lose: on {1 - self.generator_bound:.1%} of the examples no group alone makes the "
                "backbone predict what it predicts on the whole input"
            )
        return out


def own_group_scores(
    model: SOP, inputs: FeatureInputs, reference: torch.Tensor, truth: torch.Tensor, mode: str
) -> torch.Tensor:
    """Per-batch sums ``[6]`` of :class:`OwnGroups`' fields: ``model`` in eval mode on ``inputs`` in ``mode``
    against ``truth [B]``, with the backbone's full-input logits ``reference [B, C]``."""
    was_training = model.training
    model.eval()
    try:
        out = model.predict_groups(inputs, model.make_groups(inputs), mode, reference)
    finally:
        model.train(was_training)
    bounds = group_bounds(out.group_logits, reference, truth, out.logits)
    values = [
        (out.logits.argmax(-1) == truth).double(),
        (out.logits.argmax(-1) == reference.argmax(-1)).double(),
        *(bounds[k].double() for k in ("generator_bound", "selector_bound", "one_group_agrees", "selector_misses")),
    ]
    return torch.stack([v.sum() for v in values]).cpu()
