"""Model debugging (paper RQ6): does a method's prediction rest on the object more often when it is right?

The ``object_ratio`` metric (:func:`sopfast.evaluate`, ``metrics=["object_ratio"]`` with object masks) gives
per method the mean share of the used groups' features that lie on the object, over the correctly and over
the incorrectly predicted examples (:func:`sopfast.metrics.object_ratio_by_correctness`).  The paper finds
64.9 % vs 57.3 % for SOP on ImageNet-S, and the same direction for the other self-attributing models.
``docs/evaluation.md`` ("Model debugging") has the same table from ``sopfast predict``'s output with pandas.
"""

from __future__ import annotations

import math


def debugging_table(comparison: dict[str, dict]) -> list[str]:
    """Markdown lines: per method with ``object_ratio`` results, the on-object share of the used groups for
    correct and incorrect predictions, their difference and the counts; no lines when no method has them."""
    rows = {name: r["object_ratio"] for name, r in comparison.items() if isinstance(r.get("object_ratio"), dict)}
    if not rows:
        return []
    lines = [
        "Model debugging (paper RQ6): share of the used groups' patches on the object, by whether the prediction "
        "is correct:",
        "| method | correct | incorrect | difference | correct / incorrect examples |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in rows.items():
        cells = [_share(r["correct"]), _share(r["incorrect"]), _share(r["correct"] - r["incorrect"], signed=True)]
        counts = f"{r['num_correct']:.0f} / {r['num_incorrect']:.0f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {counts} |")
    return lines


def _share(value: float, signed: bool = False) -> str:
    if math.isnan(value):
        return "–"
    return f"{value:+.3f}" if signed else f"{value:.3f}"
