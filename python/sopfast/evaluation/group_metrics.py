"""Metrics of the groups themselves: diversity (distinct groups, pairwise IoU, union coverage, groups
used) and the leakage probe (paper RQ4: can a small model read the label off the masks alone?)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import check_rank, check_same_length
from ..model.group_counts import distinct_rows
from .reductions import reduce


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
    return reduce(distinct_rows(g, used).float(), reduction)


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
    return reduce(torch.where(count > 0, mean, torch.full_like(mean, float("nan"))), reduction)


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
    return reduce(
        torch.where(total > 0, covered / total.clamp_min(1), torch.full_like(covered, float("nan"))), reduction
    )


def groups_used(used: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """How many groups the selector gives a non-zero weight: ``used [N, m]`` bool summed per example."""
    check_rank("used", used, 2, "[N, m]")
    return reduce(used.bool().sum(dim=-1).float(), reduction)


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
