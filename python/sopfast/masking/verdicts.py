"""What the backbone diagnostics (:func:`sopfast.diagnose`, classification and regression alike) judge by:
the verdict's thresholds, and the refusal of a backbone whose outputs are not finite."""

from __future__ import annotations

from typing import Any

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


def verdict(report: Any) -> tuple[str, list[str]]:
    """The plain-words verdict on ``report`` (a :class:`sopfast.masking.diagnose.Diagnosis`) and what to do about it."""
    kept = report.retained()
    share = f"{report.tau:.0%}"
    if report.full_accuracy <= report.chance + 0.05:
        text = (
            f"at chance: the backbone itself scores {report.full_accuracy:.3f} on whole inputs (chance "
            f"{report.chance:.3f}), and SOP cannot be more accurate than its backbone"
        )
        return text, [
            "check that the backbone was trained for these labels (its label names and order), and the "
            "preprocessing (--image-mean/--image-std, --image-size, the tokenizer)"
        ]
    if kept >= ROBUST:
        text = (
            f"robust: one random group of {share} of the features keeps {kept:.0%} of the accuracy above chance "
            f"in {report.mode} mode, so SOP has room to learn groups better than random ones"
        )
        advice: list[str] = []
    elif kept >= BLIND:
        text = (
            f"fragile: one random group of {share} of the features keeps only {kept:.0%} of the accuracy above "
            f"chance in {report.mode} mode; SOP's groups will cost accuracy and learn slowly"
        )
        advice = [_ADAPT, raise_tau(report.blank_share)]
    else:
        text = (
            f"blind: the backbone barely predicts from {share} of its features ({kept:.0%} of its accuracy above "
            f"chance in {report.mode} mode); SOP can learn little over it as it is"
        )
        advice = [_ADAPT, raise_tau(report.blank_share)]
    better = [
        m
        for m in report.random_groups
        if m != report.mode and report.random_groups[m].one_group > report.random_groups[report.mode].one_group + 0.1
    ]
    if better:
        advice.append(f"mode={better[0]!r} (--mode {better[0]}) keeps more of the accuracy on this backbone")
    groups = report.random_groups
    if report.mode == "drop" and "exact" in groups and groups["drop"].one_group > groups["exact"].one_group + 0.1:
        advice.append(
            f"drop and exact disagree on this backbone: one random group scores {groups['drop'].one_group:.3f} in drop "
            f"but {groups['exact'].one_group:.3f} in exact, the backbone's own function on masked inputs; SOP in drop "
            "explains what the backbone computes on the kept features alone, so check its agreement with the "
            "backbone after training (sopfast evaluate --metrics accuracy agreement bounds)"
        )
    return text, advice


_ADAPT = (
    "adapt a copy of the backbone to masked inputs first (sopfast adapt / sopfast.adapt_backbone): it makes groups "
    "predictive for a little accuracy on full inputs (2-3 points on the demo's ViT), but SOP then explains the "
    "adapted copy, not your original model"
)
_RAISE_TAU = "or give the groups more of the features (a larger tau, e.g. --tau 0.4)"
#: Share of blank features at or above which a larger τ needs them ranked like any other.
BLANK_SHARE = 0.1


def raise_tau(blank_share: float | None) -> str:
    """The advice to give the groups more of the features; where ``blank_share`` (a
    :class:`~sopfast.masking.diagnose.Diagnosis`'s) is at least :data:`BLANK_SHARE`, with blank features
    ranked like any other: the default recipe ranks them last, so at a larger τ every group holds nearly
    the same other features (docs/quality.md, "Blank patches and a larger τ")."""
    if blank_share is None or blank_share < BLANK_SHARE:
        return _RAISE_TAU
    return (
        "or give the groups more of the features (a larger tau, e.g. --tau 0.4 --no-demote-blank: "
        f"{blank_share:.0%} of these features are blank, which the default recipe ranks last, so with a larger "
        "tau every group would hold nearly the same other features)"
    )
