"""Evaluation metrics of the Sum-of-Parts paper (appendix "Evaluation"), as pure tensor functions.

Shapes: ``N`` examples, ``C`` classes (or regression outputs), ``m`` groups, ``d`` features,
``S`` steps of a curve, ``P`` pixels.  Functions that average over examples take
``reduction="mean"`` (a 0-d tensor) or ``"none"`` (one value per example).  Per-example values
that are undefined (e.g. IoU against an empty ground-truth mask) are ``NaN`` and are left out of
the mean.  :func:`sopfast.evaluate` runs these on a whole loader; the functions here know nothing
of models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import check_bool, check_class_ids, check_rank, check_same_length
from ..model.agreement import group_bounds  # noqa: F401  (a metric of sopfast.metrics)
from .group_metrics import (
    DIVERSITY,
    distinct_groups,
    group_diversity,
    groups_used,
    leakage_probe,
    pairwise_iou,
    union_coverage,
)
from .reductions import reduce


# -- checks ---------------------------------------------------------------------------------
def _check_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    """``logits [N, C]`` and integer class ids ``labels [N]`` in ``[0, C)``."""
    check_rank("logits", logits, 2, "[N, C]")
    check_rank("labels", labels, 1, "[N]")
    check_same_length(logits=logits, labels=labels)
    check_class_ids("labels", labels, logits.shape[1], "classes of the logits")


# -- performance ----------------------------------------------------------------------------
def accuracy(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Fraction of examples whose arg-max class equals the label; ``logits [N, C]``, ``labels [N]``."""
    _check_labels(logits, labels)
    return reduce((logits.argmax(dim=-1) == labels.to(logits.device)).float(), reduction)


def error(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``1 − accuracy`` (the paper's "Err.")."""
    return 1.0 - accuracy(logits, labels, reduction)


def _as_targets(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    targets = targets.to(predictions.device, torch.float32)
    if targets.dim() == 1:
        targets = targets.unsqueeze(-1)
    if targets.shape != predictions.shape:
        raise ValueError(
            f"targets must have the predictions' shape {tuple(predictions.shape)} (or [N] for one output), "
            f"got {tuple(targets.shape)}"
        )
    return targets


def mse(predictions: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Mean squared error over outputs, per example; ``predictions [N, C]``, ``targets [N, C]`` or ``[N]``."""
    check_rank("predictions", predictions, 2, "[N, C]")
    targets = _as_targets(predictions, targets)
    return reduce((predictions.float() - targets).pow(2).mean(dim=-1), reduction)


def task_score(outputs: torch.Tensor, targets: torch.Tensor, task: str) -> float:
    """Accuracy (classification) or MSE (regression) of ``outputs [N, C]`` as a float."""
    if task == "regression":
        return float(mse(outputs, targets))
    return float(accuracy(outputs, targets))


# -- faithfulness ---------------------------------------------------------------------------
def fidelity(logits: torch.Tensor, attributions: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``KL(p̂ ‖ p̃)`` with ``p̂ = softmax(logits)`` and ``p̃ = softmax(Σ_i α_i)`` (appendix "Fidelity").

    ``logits [N, C]`` are the model's outputs, ``attributions [N, C, m]`` the per-group
    contributions ``α``.  Zero (to float error) for any self-attributing model, SOP included.
    Regression outputs are softmaxed too, as the paper does for CosmoGrid.
    """
    check_rank("logits", logits, 2, "[N, C]")
    check_rank("attributions", attributions, 3, "[N, C, m]")
    if attributions.shape[:2] != logits.shape:
        raise ValueError(
            f"attributions must have shape [N, C, m] with [N, C] = {tuple(logits.shape)}, "
            f"got {tuple(attributions.shape)}"
        )
    log_p = F.log_softmax(logits.double(), dim=-1)
    log_q = F.log_softmax(attributions.double().sum(dim=-1), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0)
    return reduce(kl.float(), reduction)


def probability_curve(step_logits: torch.Tensor, penalize_switch: bool = False) -> torch.Tensor:
    """Insertion/deletion curve ``[N, S]`` from the logits at each step ``step_logits [N, S, C]``.

    Each point is the highest predicted probability (the paper: "the highest predicted
    probability of the faithful models").  The last step must be the full input.  With
    ``penalize_switch`` (deletion) a point whose arg-max differs from the full-input prediction
    scores 1, the paper's "penalize the cases where the prediction is wrong by setting the score
    of that point to 1"; we read "wrong" as "no longer the model's own full-input answer", which
    needs no labels.
    """
    check_bool("penalize_switch", penalize_switch)
    check_rank("step_logits", step_logits, 3, "[N, S, C]")
    probs = step_logits.float().softmax(dim=-1)
    top, pred = probs.max(dim=-1)
    if penalize_switch:
        top = torch.where(pred == pred[:, -1:], top, torch.ones_like(top))
    return top


def mse_curve(step_predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Regression insertion/deletion curve ``[N, S]``: the MSE at each step of ``step_predictions [N, S, C]``."""
    check_rank("step_predictions", step_predictions, 3, "[N, S, C]")
    flat_targets = _as_targets(step_predictions[:, 0], targets)
    return (step_predictions.float() - flat_targets.unsqueeze(1)).pow(2).mean(dim=-1)


def curve_auc(curve: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Area under an equally spaced curve ``[N, S]`` as the mean of its points (the authors' rule)."""
    check_rank("curve", curve, 2, "[N, S]")
    return reduce(curve.mean(dim=-1), reduction)


def relative_auc(curve: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """AUC as a fraction of the full-input score ``curve[:, -1]`` (1.0 = 100 %; can exceed 1)."""
    check_rank("curve", curve, 2, "[N, S]")
    return reduce(curve.mean(dim=-1) / curve[:, -1], reduction)


def insertion(step_logits: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Insertion score for groups grown in equal steps (last step = full input); higher is better.

    ``step_logits [N, S, C]``: the model's logits with every group holding the top
    ``τ_s`` fraction of its features (``τ_s`` = 10 %, 20 %, …, 100 %).  Returns the AUC of
    :func:`probability_curve` relative to the full-input point (the paper's "percent" score).
    """
    return relative_auc(probability_curve(step_logits), reduction)


def deletion(step_logits: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Deletion score for groups shrunk in equal steps; lower is better.

    ``step_logits [N, S, C]``: logits with every group holding the *lowest*-ranked ``τ_s``
    fraction of its features (the top ``1 − τ_s`` deleted), last step = full input.  Relative
    AUC of :func:`probability_curve` with ``penalize_switch=True``.
    """
    return relative_auc(probability_curve(step_logits, penalize_switch=True), reduction)


def sparsity_curve(
    step_outputs: torch.Tensor, targets: torch.Tensor, taus: list[float], task: str = "classification"
) -> dict[float, float]:
    """Accuracy (or MSE) at each sparsity: ``step_outputs [N, S, C]`` with ``S = len(taus)`` → ``{τ: score}``."""
    check_rank("step_outputs", step_outputs, 3, "[N, S, C]")
    if step_outputs.shape[1] != len(taus):
        raise ValueError(f"step_outputs has {step_outputs.shape[1]} steps but taus has {len(taus)} values")
    return {float(t): task_score(step_outputs[:, s], targets, task) for s, t in enumerate(taus)}


# -- semantic coherence ---------------------------------------------------------------------
def _check_masks(masks: torch.Tensor, ground_truth: torch.Tensor, used: torch.Tensor | None) -> torch.Tensor:
    check_rank("masks", masks, 3, "[N, m, d]")
    check_rank("ground_truth", ground_truth, 2, "[N, d]")
    n, m, d = masks.shape
    if ground_truth.shape != (n, d):
        raise ValueError(
            f"ground_truth must have shape [N, d] = {(n, d)} to match masks {tuple(masks.shape)}, "
            f"got {tuple(ground_truth.shape)}"
        )
    if used is None:
        return torch.ones(n, m, dtype=torch.bool, device=masks.device)
    if used.shape != (n, m):
        raise ValueError(f"used must have shape [N, m] = {(n, m)}, got {tuple(used.shape)}")
    return used.bool()


def _overlaps(masks: torch.Tensor, ground_truth: torch.Tensor) -> tuple[torch.Tensor, ...]:
    g = masks.bool()
    phi = ground_truth.bool().unsqueeze(1)
    inter = (g & phi).sum(dim=-1).float()
    union = (g | phi).sum(dim=-1).float()
    return inter, union, g.sum(dim=-1).float(), phi.sum(dim=-1).float()


def _mean_over_used(values: torch.Tensor, used: torch.Tensor, defined: torch.Tensor) -> torch.Tensor:
    """Per-example mean of ``values [N, m]`` over ``used`` groups; NaN where none or not ``defined [N]``."""
    count = used.sum(dim=-1)
    mean = (values * used).sum(dim=-1) / count.clamp_min(1)
    return torch.where(defined & (count > 0), mean, torch.full_like(mean, float("nan")))


def group_iou(
    masks: torch.Tensor, ground_truth: torch.Tensor, used: torch.Tensor | None = None, reduction: str = "mean"
) -> torch.Tensor:
    """Mean ``|g ∩ φ| / |g ∪ φ|`` over the used groups (appendix "IOU"; its formula prints
    ``1 − IoU`` but the tables report IoU, higher is better).

    ``masks [N, m, d]`` groups, ``ground_truth [N, d]`` object / evidence mask, ``used [N, m]``
    which groups to score (default all).  NaN for examples with an empty ground truth.
    """
    used = _check_masks(masks, ground_truth, used)
    inter, union, _, gt = _overlaps(masks, ground_truth)
    return reduce(_mean_over_used(inter / union.clamp_min(1), used, gt[:, 0] > 0), reduction)


def group_coverage(
    masks: torch.Tensor, ground_truth: torch.Tensor, used: torch.Tensor | None = None, reduction: str = "mean"
) -> torch.Tensor:
    """Mean ``|g ∩ φ| / |φ|`` over the used groups: how much of the object each group covers."""
    used = _check_masks(masks, ground_truth, used)
    inter, _, _, gt = _overlaps(masks, ground_truth)
    return reduce(_mean_over_used(inter / gt.clamp_min(1), used, gt[:, 0] > 0), reduction)


def object_ratio(
    masks: torch.Tensor, ground_truth: torch.Tensor, used: torch.Tensor | None = None, reduction: str = "mean"
) -> torch.Tensor:
    """Mean ``|g ∩ φ| / |g|`` over the used groups: the fraction of a group that lies on the object."""
    used = _check_masks(masks, ground_truth, used)
    inter, _, size, gt = _overlaps(masks, ground_truth)
    return reduce(_mean_over_used(inter / size.clamp_min(1), used, gt[:, 0] > 0), reduction)


def object_ratio_by_correctness(ratios: torch.Tensor, correct: torch.Tensor) -> dict[str, float]:
    """Mean object ratio of correctly vs incorrectly predicted examples (paper §4, RQ6).

    ``ratios [N]`` from :func:`object_ratio` with ``reduction="none"``; ``correct [N]`` bool.
    A side with no (defined) example is NaN.
    """
    check_rank("ratios", ratios, 1, "[N]")
    check_rank("correct", correct, 1, "[N]")
    check_same_length(ratios=ratios, correct=correct)
    correct = correct.bool().to(ratios.device)
    return {
        "correct": float(ratios[correct].nanmean()) if bool(correct.any()) else float("nan"),
        "incorrect": float(ratios[~correct].nanmean()) if bool((~correct).any()) else float("nan"),
        "num_correct": int(correct.sum()),
        "num_incorrect": int((~correct).sum()),
    }


def cosmogrid_alignment(pixel_masks: torch.Tensor, maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Void and cluster alignment ``[N, m]`` of each group (appendix "Threshold-based Purity").

    ``pixel_masks [N, m, P]`` groups at pixel resolution, ``maps [N, P]`` the mass maps.
    ``Align_void = |g ⊙ x < 0| / |g| · 1[gᵀx < 0]``;
    ``Align_cluster = |g ⊙ x > 3σ(x)| / |g|`` with ``σ(x)`` the map's standard deviation
    (unbiased, as ``torch.std``).
    """
    check_rank("pixel_masks", pixel_masks, 3, "[N, m, P]")
    check_rank("maps", maps, 2, "[N, P]")
    if pixel_masks.shape[0] != maps.shape[0] or pixel_masks.shape[2] != maps.shape[1]:
        raise ValueError(
            f"pixel_masks [N, m, P] and maps [N, P] must agree on N and P, got {tuple(pixel_masks.shape)} "
            f"and {tuple(maps.shape)}"
        )
    g = pixel_masks.bool()
    x = maps.float().unsqueeze(1)
    size = g.sum(dim=-1).clamp_min(1).float()
    sigma = maps.float().std(dim=-1).view(-1, 1, 1)
    mass = (x * g).sum(dim=-1)
    void = (g & (x < 0)).sum(dim=-1) / size * (mass < 0)
    cluster = (g & (x > 3 * sigma)).sum(dim=-1) / size
    return void, cluster


def cosmogrid_purity(
    pixel_masks: torch.Tensor,
    maps: torch.Tensor,
    used: torch.Tensor | None = None,
    tau_v: float = 0.6,
    tau_c: float = 0.015,
    reduction: str = "mean",
) -> torch.Tensor:
    """CosmoGrid purity: how often the used groups are voids or clusters.

    A group is a void when ``Align_void > τ_v`` and a cluster when ``Align_cluster > τ_c``
    (:func:`cosmogrid_alignment`).  Per output ``c`` the purity is the mean of the void rate and
    the cluster rate over the groups used for ``c``; the example's purity averages the outputs
    (Ω_m, σ_8).  The paper writes the per-group score as ``1[void] + 1[cluster]``; its reported
    numbers are this mean of the two rates (the authors' code), which lies in [0, 1].
    ``used [N, C, m]`` (default: every group for one output).
    """
    void, cluster = cosmogrid_alignment(pixel_masks, maps)
    return purity_of_alignments(void, cluster, used, tau_v, tau_c, reduction)


def purity_of_alignments(
    void: torch.Tensor,
    cluster: torch.Tensor,
    used: torch.Tensor | None = None,
    tau_v: float = 0.6,
    tau_c: float = 0.015,
    reduction: str = "mean",
) -> torch.Tensor:
    """:func:`cosmogrid_purity` from the alignments ``void, cluster [N, m]`` (:func:`cosmogrid_alignment`),
    so that several thresholds score the same groups; NaN for an example whose outputs use no group."""
    for name, value in (("tau_v", tau_v), ("tau_c", tau_c)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")
    n, m = void.shape
    if used is None:
        used = torch.ones(n, 1, m, dtype=torch.bool, device=void.device)
    elif used.dim() != 3 or used.shape[0] != n or used.shape[2] != m:
        raise ValueError(f"used must have shape [N, C, m] with N={n}, m={m}, got {tuple(used.shape)}")
    score = ((void > tau_v).float() + (cluster > tau_c).float()) / 2
    used = used.bool()
    per_output = (score.unsqueeze(1) * used).sum(dim=-1) / used.sum(dim=-1).clamp_min(1)
    has_group = used.any(dim=-1)
    per_example = (per_output * has_group).sum(dim=-1) / has_group.sum(dim=-1).clamp_min(1)
    per_example = torch.where(has_group.any(dim=-1), per_example, torch.full_like(per_example, float("nan")))
    return reduce(per_example, reduction)


def merged_group_weights(masks: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``[N, C, m]``: the selector weights ``scores [N, C, m]`` with the weights of identical groups (``masks
    [N, m, d]``, the same features) summed onto the first of them, the others 0 — one weight per distinct group."""
    check_rank("masks", masks, 3, "[N, m, d]")
    check_rank("scores", scores, 3, "[N, C, m]")
    if scores.shape[0] != masks.shape[0] or scores.shape[2] != masks.shape[1]:
        raise ValueError(f"masks [N, m, d] and scores [N, C, m] disagree: {tuple(masks.shape)}, {tuple(scores.shape)}")
    same = (masks.unsqueeze(2) == masks.unsqueeze(1)).all(dim=-1)  # [N, m, m]
    first = same.int().argmax(dim=-1)  # the first identical group (a group is identical to itself)
    index = first.unsqueeze(1).expand(-1, scores.shape[1], -1)
    return torch.zeros_like(scores, dtype=torch.float32).scatter_add_(-1, index, scores.float())


def structure_weights(
    void: torch.Tensor, cluster: torch.Tensor, weights: torch.Tensor, tau_v: float = 0.6, tau_c: float = 0.015
) -> dict[str, list[torch.Tensor]]:
    """The weights of the used groups that are voids and clusters, output by output (paper RQ7):
    ``{"void": [w of output 0, …], "cluster": […]}``, each a 1-D tensor of the weights ``> 0`` of groups
    whose alignment (``void, cluster [N, m]``, :func:`cosmogrid_alignment`) exceeds ``τ_v`` / ``τ_c``;
    ``weights [N, C, m]`` (:func:`merged_group_weights`)."""
    check_rank("weights", weights, 3, "[N, C, m]")
    if void.shape != cluster.shape or void.shape != (weights.shape[0], weights.shape[2]):
        raise ValueError(f"void and cluster must be [N, m] = {(weights.shape[0], weights.shape[2])}")
    kinds = {"void": void > tau_v, "cluster": cluster > tau_c}
    return {
        kind: [weights[:, c][is_kind & (weights[:, c] > 0)] for c in range(weights.shape[1])]
        for kind, is_kind in kinds.items()
    }


__all__ = [
    "DIVERSITY",
    "accuracy",
    "cosmogrid_alignment",
    "cosmogrid_purity",
    "curve_auc",
    "deletion",
    "distinct_groups",
    "error",
    "fidelity",
    "group_coverage",
    "group_diversity",
    "group_iou",
    "groups_used",
    "insertion",
    "leakage_probe",
    "merged_group_weights",
    "mse",
    "mse_curve",
    "object_ratio",
    "object_ratio_by_correctness",
    "pairwise_iou",
    "probability_curve",
    "purity_of_alignments",
    "relative_auc",
    "sparsity_curve",
    "structure_weights",
    "task_score",
    "union_coverage",
]


# -- agreement with the backbone the model explains -------------------------------------------------
def agreement(logits: torch.Tensor, reference_logits: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Whether the top-1 class of ``logits [B, C]`` is the frozen backbone's on the whole input
    (``reference_logits [B, C]``): 1/0 per example, or their mean."""
    same = (logits.argmax(dim=-1) == reference_logits.argmax(dim=-1)).float()
    return same if reduction == "none" else same.mean()


def agreement_kl(logits: torch.Tensor, reference_logits: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``KL(p_backbone ‖ p_model)`` per example (or the mean): how far the class distribution of ``logits
    [B, C]`` is from the backbone's on the whole input (``reference_logits [B, C]``); 0 when they are equal."""
    target = torch.log_softmax(reference_logits.float(), dim=-1)
    kl = (target.exp() * (target - torch.log_softmax(logits.float(), dim=-1))).sum(dim=-1)
    return kl if reduction == "none" else kl.mean()
