"""Plain-text tables of :func:`sopfast.evaluate`'s results: scalar metrics, then one table per curve."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from . import metrics as M

Results = dict[str, dict[str, Any]]

SCALARS = (
    "accuracy",
    "agreement",
    "agreement_kl",
    "generator_bound",
    "selector_bound",
    "selector_misses",
    "error",
    "mse",
    "fidelity",
    "insertion",
    "deletion",
    "iou",
    "coverage",
    "purity",
    "on_object",
    "on_object_used",
    "object_iou",
    *M.DIVERSITY,
)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def _render(title: str, headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([title, line, "-" * len(line), *body])


def format_table(results: Results) -> str:
    """Plain-text tables of :func:`evaluate`'s results: scalar metrics, then one table per curve."""
    if not isinstance(results, Mapping) or not all(isinstance(v, Mapping) for v in results.values()):
        raise TypeError(f"results must be evaluate()'s {{method: {{metric: value}}}}, got {type(results).__name__}")
    methods = list(results)
    sections = []
    cols = [c for c in SCALARS if any(c in results[m] for m in methods)]
    extra = [
        ("leakage", "accuracy", "leak acc"),
        ("leakage", "chance", "leak chance"),
        ("object_ratio", "correct", "obj correct"),
        ("object_ratio", "incorrect", "obj incorrect"),
    ]
    extra = [e for e in extra if any(e[0] in results[m] for m in methods)]
    headers = ["method", "examples", *cols, *(e[2] for e in extra)]
    rows = [
        [
            m,
            str(results[m]["examples"]),
            *(_fmt(results[m].get(c, "-")) for c in cols),
            *(_fmt(results[m][e[0]][e[1]]) if e[0] in results[m] else "-" for e in extra),
        ]
        for m in methods
    ]
    sections.append(_render("metrics", headers, rows))
    for curve, label in (("sparsity", "τ"), ("num_groups", "m"), ("insertion_curve", "τ"), ("deletion_curve", "τ")):
        owners = [m for m in methods if curve in results[m]]
        if owners:
            keys = list(results[owners[0]][curve])
            rows = [[m, *(_fmt(results[m][curve][k]) for k in keys)] for m in owners]
            sections.append(_render(curve, ["method", *(f"{label}={k:g}" for k in keys)], rows))
    owners = [m for m in methods if "curves" in results[m]]
    if owners:
        keys = list(dict.fromkeys(k for m in owners for k in results[m]["curves"]))
        rows = [[m, *(_fmt(results[m]["curves"].get(k, "-")) for k in keys)] for m in owners]
        sections.append(_render("curves (τ/m)", ["method", *keys], rows))
    return "\n\n".join(sections)
