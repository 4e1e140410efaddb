"""Which examples a limited run takes: as many of every class as the limit allows, the same ones every run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def across_classes(labels: Sequence[Any], limit: int, seed: int = 0) -> list[int]:
    """``limit`` positions of ``labels`` taken class by class in turn (each class's examples in an order
    shuffled with ``seed``), so that ``--limit`` / ``--count`` keep every class: ``[cat, dog, owl, cat, …]``
    rather than the first ``limit`` examples, which in a folder sorted by class are all of one class."""
    if limit >= len(labels):
        return list(range(len(labels)))
    order = np.random.default_rng(seed).permutation(len(labels))
    by_class: dict[Any, list[int]] = {}
    for i in order.tolist():
        by_class.setdefault(labels[i], []).append(i)
    queues = [by_class[c] for c in sorted(by_class, key=str)]
    picked: list[int] = []
    depth = 0
    while len(picked) < limit:
        picked += [queue[depth] for queue in queues if depth < len(queue)][: limit - len(picked)]
        depth += 1
    return picked


def stratified_holdout(labels: Sequence[Any], fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Positions of ``labels`` cut in two with ``seed``: the rest and a held-out ``fraction`` of every class
    (at least one example of a class with two or more), both in ascending order."""
    order = np.random.default_rng(seed).permutation(len(labels))
    by_class: dict[Any, list[int]] = {}
    for i in order.tolist():
        by_class.setdefault(labels[i], []).append(i)
    held: list[int] = []
    for members in by_class.values():
        count = min(len(members) - 1, max(1, round(len(members) * fraction))) if len(members) > 1 else 0
        held += members[:count]
    chosen = set(held)
    return [i for i in range(len(labels)) if i not in chosen], sorted(held)
