"""Results of several training seeds as one: the mean and the spread of every number.

:func:`combine_seeds` takes the :func:`sopfast.evaluation.evaluate` results of the same methods on the
same data, one per training seed, and returns one results dict of the same shape whose numbers are
the means, plus a dict of the same shape holding the spreads (max − min over the seeds).  A method
present in only some runs (a baseline evaluated once, since it does not depend on SOP's training)
keeps its values with spread 0 and ``seeds`` = the number of runs it came from.
"""

from __future__ import annotations

import math
from typing import Any

Results = dict[str, dict[str, Any]]


def _combine(values: list[Any]) -> tuple[Any, Any]:
    """Mean and spread of numbers, key by key for dicts of numbers; anything else: the first value."""
    first = values[0]
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(v, dict) and k in v for v in values)]
        pairs = {k: _combine([v[k] for v in values]) for k in keys}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        numbers = [float(v) for v in values]
        finite = [v for v in numbers if not math.isnan(v)]
        if not finite:
            return math.nan, math.nan
        return sum(finite) / len(finite), max(finite) - min(finite)
    return first, None


def combine_seeds(runs: list[Results]) -> tuple[Results, Results]:
    """``(mean, spread)`` of ``runs`` (one :func:`evaluate` result per seed), method by method and
    metric by metric; each method's entry gains ``"seeds"``: how many runs it was in."""
    if not runs:
        raise ValueError("combine_seeds needs at least one run, got none")
    mean: Results = {}
    spread: Results = {}
    methods = list(dict.fromkeys(name for run in runs for name in run))
    for name in methods:
        present = [run[name] for run in runs if name in run]
        metrics = [k for k in present[0] if all(k in r for r in present)]
        combined = {k: _combine([r[k] for r in present]) for k in metrics}
        mean[name] = {k: c[0] for k, c in combined.items()} | {"seeds": len(present)}
        spread[name] = {k: c[1] for k, c in combined.items() if c[1] is not None}
    return mean, spread


def format_with_spread(value: float, spread: float | None, digits: int = 3) -> str:
    """``"0.812 ± 0.004"`` (half the spread: the distance from the mean to either seed when there are
    two); just the value when there is no spread."""
    if value != value:
        return "–"
    if not spread:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ± {spread / 2:.{digits}f}"


__all__ = ["combine_seeds", "format_with_spread"]
