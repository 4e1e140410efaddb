"""What the backbone diagnostics (:func:`sopfast.diagnose`, classification and regression alike) judge by:
the verdict's thresholds, and the refusal of a backbone whose outputs are not finite."""

from __future__ import annotations

import torch

from ..adapters import BackboneAdapter
from ..integrity import non_finite

#: Share of the backbone's accuracy above chance kept on one random group, at or above which SOP has room
#: to learn groups better than random ones, and below which it learns little.
ROBUST, BLIND = 0.5, 0.2


def check_finite(values: torch.Tensor, adapter: BackboneAdapter, what: str) -> None:
    """A ValueError when ``values`` (the backbone's logits) hold NaN or ±Inf, naming why: the first
    non-finite parameter or buffer of the backbone, else ``what`` (the adapters refuse non-finite inputs)."""
    if bool(torch.isfinite(values).all()):
        return
    backbone = adapter.backbone
    weights = non_finite({**dict(backbone.named_parameters()), **dict(backbone.named_buffers())})
    if weights:
        more = f" ({len(weights) - 1} more)" if weights[1:] else ""
        cause = f"its parameter {weights[0]!r} holds NaN or Inf{more}"
    else:
        cause = f"{what} holds NaN or Inf"
    raise ValueError(f"diagnose: the backbone's outputs are not finite: {cause}; accuracies over them mean nothing")


def below_the_bar(diagnosis: dict | None, best_accuracy: float | None, provenance: dict) -> str | None:
    """In words, when a trained SOP's best validation accuracy stayed below what groups that are not learned
    reach in the run's ``diagnosis`` (its ``to_beat``), with its agreement with the backbone at the last
    evaluation (the model's ``provenance["validation"]``); ``None`` when it did not, or without either."""
    bar = (diagnosis or {}).get("to_beat")
    if bar is None or best_accuracy is None or best_accuracy >= bar:
        return None
    agreement = (provenance.get("validation") or {}).get("val_agreement")
    agrees = "" if agreement is None else f"; at the last evaluation it agreed with the backbone on {agreement:.1%}"
    return (
        f"SOP's best validation accuracy {best_accuracy:.3f} stayed below {bar:.3f}, what groups that are "
        f'not learned reach in the diagnostic{agrees}: train longer, or see docs/training.md ("Before the '
        'first step: what the backbone allows")'
    )
