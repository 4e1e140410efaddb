"""Results of disjoint parts of one test set as one: :func:`combine_parts`.

:func:`sopfast.evaluate` reports means over examples (accuracy, the curves, insertion and deletion as
fractions of each example's full-input score, the group metrics), so the results of a test set split
into parts — e.g. short and long texts, each reported on its own — combine into the results on the
whole set as the means weighted by each part's ``examples``.
"""

from __future__ import annotations

import math
from typing import Any

from .seeds import Results


def _weighted(values: list[Any], weights: list[float]) -> Any:
    """Weighted mean of numbers (NaN parts left out), key by key for dicts; anything else: the first."""
    first = values[0]
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(v, dict) and k in v for v in values)]
        return {k: _weighted([v[k] for v in values], weights) for k in keys}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        pairs = [(float(v), w) for v, w in zip(values, weights) if not math.isnan(float(v)) and w > 0]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else math.nan
    return first


def combine_parts(parts: list[Results]) -> Results:
    """One results dict from ``parts`` (:func:`sopfast.evaluate` results of the same methods on disjoint
    parts of a test set): every number is the mean over the parts weighted by the part's ``examples``
    (which are summed); a method or metric missing from some part is left out."""
    if not parts:
        raise ValueError("combine_parts needs at least one part, got none")
    out: Results = {}
    for name in [n for n in parts[0] if all(n in p for p in parts)]:
        rows = [p[name] for p in parts]
        weights = [float(r.get("examples", 0)) for r in rows]
        keys = [k for k in rows[0] if all(k in r for r in rows)]
        out[name] = {k: _weighted([r[k] for r in rows], weights) for k in keys}
        if "examples" in out[name]:
            out[name]["examples"] = int(sum(weights))
    return out


__all__ = ["combine_parts"]
