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

from ..checks import check_rank, check_same_length

REDUCTIONS = ("mean", "none")


# -- checks ---------------------------------------------------------------------------------
def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    _check_reduction(reduction)
    return values.nanmean() if reduction == "mean" else values


def _check_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    check_rank("logits", logits, 2, "[N, C]")
    check_rank("labels", labels, 1, "[N]")
    check_same_length(logits=logits, labels=labels)


# -- performance ----------------------------------------------------------------------------
def accuracy(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Fraction of examples whose arg-max class equals the label; ``logits [N, C]``, ``labels [N]``."""
    _check_labels(logits, labels)
    return _reduce((logits.argmax(dim=-1) == labels.to(logits.device)).float(), reduction)


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
    return _reduce((predictions.float() - targets).pow(2).mean(dim=-1), reduction)


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
    return _reduce(kl.float(), reduction)


def probability_curve(step_logits: torch.Tensor, penalize_switch: bool = False) -> torch.Tensor:
    """Insertion/deletion curve ``[N, S]`` from the logits at each step ``step_logits [N, S, C]``.

    Each point is the highest predicted probability (the paper: "the highest predicted
    probability of the faithful models").  The last step must be the full input.  With
    ``penalize_switch`` (deletion) a point whose arg-max differs from the full-input prediction
    scores 1, the paper's "penalize the cases where the prediction is wrong by setting the score
    of that point to 1"; we read "wrong" as "no longer the model's own full-input answer", which
    needs no labels.
    """
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
    return _reduce(curve.mean(dim=-1), reduction)


def relative_auc(curve: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """AUC as a fraction of the full-input score ``curve[:, -1]`` (1.0 = 100 %; can exceed 1)."""
    check_rank("curve", curve, 2, "[N, S]")
    return _reduce(curve.mean(dim=-1) / curve[:, -1], reduction)


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
    return _reduce(_mean_over_used(inter / union.clamp_min(1), used, gt[:, 0] > 0), reduction)


def group_coverage(
    masks: torch.Tensor, ground_truth: torch.Tensor, used: torch.Tensor | None = None, reduction: str = "mean"
) -> torch.Tensor:
    """Mean ``|g ∩ φ| / |φ|`` over the used groups: how much of the object each group covers."""
    used = _check_masks(masks, ground_truth, used)
    inter, _, _, gt = _overlaps(masks, ground_truth)
    return _reduce(_mean_over_used(inter / gt.clamp_min(1), used, gt[:, 0] > 0), reduction)


def object_ratio(
    masks: torch.Tensor, ground_truth: torch.Tensor, used: torch.Tensor | None = None, reduction: str = "mean"
) -> torch.Tensor:
    """Mean ``|g ∩ φ| / |g|`` over the used groups: the fraction of a group that lies on the object."""
    used = _check_masks(masks, ground_truth, used)
    inter, _, size, gt = _overlaps(masks, ground_truth)
    return _reduce(_mean_over_used(inter / size.clamp_min(1), used, gt[:, 0] > 0), reduction)


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
    for name, value in (("tau_v", tau_v), ("tau_c", tau_c)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")
    void, cluster = cosmogrid_alignment(pixel_masks, maps)
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
    return _reduce(per_example, reduction)


# -- group diversity ------------------------------------------------------------------------
def _check_group_masks(
    masks: torch.Tensor, valid: torch.Tensor | None, used: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(masks [N, m, d] bool, valid [N, d] bool, used [N, m] bool)`` with defaults filled in."""
    check_rank("masks", masks, 3, "[N, m, d]")
    n, m, d = masks.shape
    if valid is None:
        valid = torch.ones(n, d, dtype=torch.bool, device=masks.device)
    elif tuple(valid.shape) != (n, d):
        raise ValueError(f"valid must have shape [N, d] = {(n, d)} to match masks, got {tuple(valid.shape)}")
    if used is None:
        used = torch.ones(n, m, dtype=torch.bool, device=masks.device)
    elif tuple(used.shape) != (n, m):
        raise ValueError(f"used must have shape [N, m] = {(n, m)}, got {tuple(used.shape)}")
    return masks.bool() & valid.bool().unsqueeze(1).to(masks.device), valid.bool(), used.bool().to(masks.device)


def distinct_groups(
    masks: torch.Tensor,
    valid: torch.Tensor | None = None,
    used: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """How many different groups an input has: distinct rows of ``masks [N, m, d]`` per example.

    ``valid [N, d]`` marks the candidate features (padding outside it is ignored); ``used
    [N, m]`` restricts the count to those groups (default all).  An example with no used group
    counts 0.
    """
    g, _, used = _check_group_masks(masks, valid, used)
    same = (g.unsqueeze(2) == g.unsqueeze(1)).all(dim=-1)
    m = g.shape[1]
    earlier = torch.ones(m, m, dtype=torch.bool, device=g.device).tril(-1)
    repeated = (same & earlier & used.unsqueeze(1)).any(dim=-1)
    return _reduce((used & ~repeated).sum(dim=-1).float(), reduction)


def pairwise_iou(
    masks: torch.Tensor,
    valid: torch.Tensor | None = None,
    used: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Mean ``|g_i ∩ g_j| / |g_i ∪ g_j|`` over the pairs ``i < j`` of an example's groups.

    ``masks [N, m, d]``; 1 when all groups are the same, 0 when they are disjoint.  Only
    ``used [N, m]`` groups are paired (default all); NaN with fewer than two.  Two empty groups
    have IoU 1.
    """
    g, _, used = _check_group_masks(masks, valid, used)
    f = g.float()
    inter = f @ f.transpose(1, 2)
    size = f.sum(dim=-1)
    union = size.unsqueeze(2) + size.unsqueeze(1) - inter
    iou = torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(inter))
    m = g.shape[1]
    upper = torch.ones(m, m, dtype=torch.bool, device=g.device).triu(1)
    pairs = upper & used.unsqueeze(2) & used.unsqueeze(1)
    count = pairs.sum(dim=(1, 2))
    mean = (iou * pairs).sum(dim=(1, 2)) / count.clamp_min(1)
    return _reduce(torch.where(count > 0, mean, torch.full_like(mean, float("nan"))), reduction)


def union_coverage(
    masks: torch.Tensor,
    valid: torch.Tensor | None = None,
    used: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Fraction of an example's candidate features (``valid [N, d]``, default all) that lie in at
    least one of its (``used``) groups ``masks [N, m, d]``; NaN without candidates."""
    g, valid, used = _check_group_masks(masks, valid, used)
    covered = (g & used.unsqueeze(-1)).any(dim=1).sum(dim=-1).float()
    total = valid.sum(dim=-1).float().to(covered.device)
    return _reduce(
        torch.where(total > 0, covered / total.clamp_min(1), torch.full_like(covered, float("nan"))), reduction
    )


def groups_used(used: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """How many groups the selector gives a non-zero weight: ``used [N, m]`` bool summed per example."""
    check_rank("used", used, 2, "[N, m]")
    return _reduce(used.bool().sum(dim=-1).float(), reduction)


DIVERSITY = ("distinct_groups", "pairwise_iou", "union_coverage", "groups_used", "distinct_used_groups")


def group_diversity(
    masks: torch.Tensor, valid: torch.Tensor | None = None, used: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Per-example diversity of the groups ``masks [N, m, d]`` (each value ``[N]``).

    ``distinct_groups``, ``pairwise_iou`` and ``union_coverage`` over all ``m`` groups;
    ``groups_used`` (the selector's non-zero weights ``used [N, m]``, default all) and
    ``distinct_used_groups`` (distinct groups among those).
    """
    check_rank("masks", masks, 3, "[N, m, d]")
    if used is None:
        used = torch.ones(masks.shape[:2], dtype=torch.bool, device=masks.device)
    return {
        "distinct_groups": distinct_groups(masks, valid, reduction="none"),
        "pairwise_iou": pairwise_iou(masks, valid, reduction="none"),
        "union_coverage": union_coverage(masks, valid, reduction="none"),
        "groups_used": groups_used(used, reduction="none"),
        "distinct_used_groups": distinct_groups(masks, valid, used, reduction="none"),
    }


# -- leakage --------------------------------------------------------------------------------
def leakage_probe(
    masks: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int | None = None,
    train_fraction: float = 0.5,
    weight_decay: float = 1e-3,
    max_iter: int = 100,
    seed: int = 0,
) -> dict[str, float]:
    """Can the label be read off the group masks alone? (paper §4, RQ4; appendix "Information Leak").

    Trains a logistic regression (a linear probe: L-BFGS from zero weights, L2 penalty
    ``weight_decay``) on the flattened masks ``[N, ...]`` of a random ``train_fraction`` of the
    examples and reports its accuracy on the rest next to ``chance``, the held-out accuracy of
    always answering the most frequent training label.  A leak-free generator keeps ``accuracy``
    near ``chance``.
    """
    if not isinstance(masks, torch.Tensor) or masks.dim() < 2:
        shape = tuple(masks.shape) if isinstance(masks, torch.Tensor) else type(masks).__name__
        raise ValueError(f"masks must be a tensor [N, ...] with one mask set per example, got {shape}")
    check_rank("labels", labels, 1, "[N]")
    check_same_length(masks=masks, labels=labels)
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction}")
    n = int(labels.shape[0])
    n_train = round(n * train_fraction)
    if n_train < 1 or n - n_train < 1:
        raise ValueError(f"the leakage probe needs at least 2 examples to split into train and test, got {n}")
    labels = labels.long().cpu()
    classes = int(num_classes) if num_classes is not None else int(labels.max()) + 1
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    x = masks.reshape(n, -1).float().cpu()
    train, test = order[:n_train], order[n_train:]
    probe = _fit_linear_probe(x[train], labels[train], classes, weight_decay, max_iter)
    with torch.no_grad():
        acc = float((probe(x[test]).argmax(dim=-1) == labels[test]).float().mean())
    majority = int(torch.bincount(labels[train], minlength=classes).argmax())
    chance = float((labels[test] == majority).float().mean())
    return {"accuracy": acc, "chance": chance, "num_train": n_train, "num_test": n - n_train}


def _fit_linear_probe(
    x: torch.Tensor, y: torch.Tensor, classes: int, weight_decay: float, max_iter: int
) -> torch.nn.Linear:
    probe = torch.nn.Linear(x.shape[1], classes)
    torch.nn.init.zeros_(probe.weight)
    torch.nn.init.zeros_(probe.bias)
    opt = torch.optim.LBFGS(probe.parameters(), max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(probe(x), y) + weight_decay * probe.weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return probe


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
    "mse",
    "mse_curve",
    "object_ratio",
    "object_ratio_by_correctness",
    "pairwise_iou",
    "probability_curve",
    "relative_auc",
    "sparsity_curve",
    "task_score",
    "union_coverage",
]
