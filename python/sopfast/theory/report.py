"""Minimum total errors over a range of dimensions: the series, their table, fits and plot."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import check_choice
from ..integrity import save_figure
from .bounds import (
    KINDS,
    MAX_ENUMERATED_D,
    PAPER_FITS,
    ExponentialFit,
    Kind,
    binomial_polynomial,
    fit_exponential,
    group_construction,
    min_total_error,
    monomial_polynomial,
    total_deletion_error,
    total_insertion_error,
)


@dataclass(frozen=True)
class BoundSeries:
    """Minimum total errors of one kind over a range of ``d`` with the enumeration cross-check."""

    kind: Kind
    mse: bool
    ds: tuple[int, ...]
    values: tuple[float, ...]
    enumerated: tuple[float | None, ...]
    fit: ExponentialFit | None


def valid_dimensions(kind: Kind, ds: Iterable[int], *, equal_blocks: bool = True) -> list[int]:
    """The ``d`` in ``ds`` at which ``kind`` is defined (binomial: multiples of 3 or ``d >= 2``)."""
    if check_choice("kind", kind, KINDS) == "monomial-deletion":
        return [d for d in ds if d >= 1]
    if equal_blocks:
        return [d for d in ds if d >= 3 and d % 3 == 0]
    return [d for d in ds if d >= 2]


def compute_series(
    kind: Kind, ds: Iterable[int], *, mse: bool = False, equal_blocks: bool = True, verify_max_d: int = 12
) -> BoundSeries:
    """Minimum errors for ``kind`` at every valid ``d``, cross-checked by enumeration for ``d <= verify_max_d``.

    Raises ``RuntimeError`` when the symmetric and the enumerated values disagree.
    """
    dims = valid_dimensions(kind, ds, equal_blocks=equal_blocks)
    values, checks = [], []
    for d in _progress(dims, enabled=verify_max_d > 14):
        value = min_total_error(kind, d, mse=mse, equal_blocks=equal_blocks)
        check = None
        if d <= min(verify_max_d, MAX_ENUMERATED_D):
            check = min_total_error(kind, d, mse=mse, method="enumerate", equal_blocks=equal_blocks)
            if not math.isclose(value, check, rel_tol=1e-7, abs_tol=1e-7):
                raise RuntimeError(f"{kind} at d={d}: symmetric value {value} != enumerated value {check}")
        values.append(value)
        checks.append(check)
    fit = fit_exponential(dims, values) if len(dims) >= 3 and np.ptp(values) > 0 else None
    return BoundSeries(kind, mse, tuple(dims), tuple(values), tuple(checks), fit)


def _progress(items: list[int], *, enabled: bool) -> Iterable[int]:
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="d", file=sys.stderr)


def format_table(series: Sequence[BoundSeries]) -> str:
    """Fixed-width table of the series: one row per ``d``, value and enumerated check per kind."""
    dims = sorted({d for s in series for d in s.ds})
    names = [s.kind + (" (MSE)" if s.mse else "") for s in series]
    header = f"{'d':>4}" + "".join(f"  {name:>26}  {'enumerated':>16}" for name in names)
    lines = [header, "-" * len(header)]
    for d in dims:
        row = f"{d:>4}"
        for s in series:
            if d in s.ds:
                i = s.ds.index(d)
                check = s.enumerated[i]
                row += f"  {s.values[i]:>26.3f}  {'-' if check is None else f'{check:.3f}':>16}"
            else:
                row += f"  {'-':>26}  {'-':>16}"
        lines.append(row)
    return "\n".join(lines)


def format_fits(series: Sequence[BoundSeries]) -> str:
    """One line per series with its fitted gammas next to the paper's (fitted over d = 2..20)."""
    lines = []
    for s in series:
        if s.fit is None:
            continue
        f = s.fit
        paper = PAPER_FITS[(s.kind, s.mse)]
        lines.append(
            f"{s.kind}{' (MSE)' if s.mse else ''} fit over d={s.ds[0]}..{s.ds[-1]}: "
            f"gamma0={f.gamma0:.3f} gamma1={f.gamma1:.3f} gamma2={f.gamma2:.3f} "
            f"(rel. abs. error {f.relative_abs_error:.3f}); paper (d=2..20): "
            f"({paper[0]:.3f}, {paper[1]:.3f}, {paper[2]:.3f})"
        )
    return "\n".join(lines)


def plot_series(series: Sequence[BoundSeries], path: str) -> None:
    """Write the paper's Figure 2 style plot (dots: minima, line: exponential fit) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = sorted(series, key=lambda s: s.kind != "binomial-insertion")  # the paper's panel order
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4), squeeze=False)
    for ax, s in zip(axes[0], series):
        what = "insertion" if s.kind == "binomial-insertion" else "deletion"
        ax.plot(s.ds, s.values, "o", label="minimum (exact)")
        if s.fit is not None:
            grid = np.linspace(s.ds[0], s.ds[-1], 200)
            f = s.fit
            ax.plot(grid, f(grid), "-", label=f"{f.gamma0:.3f} + exp({f.gamma1:.3f} + {f.gamma2:.3f} d)")
        ax.set_yscale("log")
        ax.set_xlabel("dimension d")
        ax.set_ylabel(f"minimum total {'squared ' if s.mse else ''}{what} error")
        ax.set_title(f"{s.kind.split('-')[0].capitalize()}s: per-feature SANN lower bound")
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def group_check_summary(kinds: Sequence[Kind], max_d: int) -> str:
    """Verify the group construction's zero error on the paper's polynomials at a small ``d``."""
    lines = []
    for kind in kinds:
        dims = valid_dimensions(kind, range(1, min(max_d, 12) + 1))
        if not dims:
            continue
        d = dims[-1]
        poly = monomial_polynomial(d) if kind == "monomial-deletion" else binomial_polynomial(d)
        model = group_construction(poly)
        ins, dele = total_insertion_error(poly, model), total_deletion_error(poly, model)
        lines.append(
            f"group construction, {kind.split('-')[0]} d={d}: {len(model.groups)} group(s), "
            f"total insertion error {ins}, total deletion error {dele}"
        )
    return "\n".join(lines)
