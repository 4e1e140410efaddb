"""Error bounds for per-feature self-attributing models and the zero-error group construction.

Implements the theory of the Sum-of-Parts paper (§2 and appendix "Theory Details and Proofs").
A per-feature SANN for a target ``p`` at input ``x`` is a vector ``alpha`` (one contribution per
feature); inserting a subset ``S`` costs ``|p(x_S) - p(0) - sum_{i in S} alpha_i|``, deleting it
costs ``|p(x) - p(x_{not S}) - sum_{i in S} alpha_i|``. The *total* error sums over all ``2^d``
subsets. Minimising it is the linear program ``min_alpha 1^T |c - M alpha|`` whose rows ``M_S`` are
subset indicators; the paper solves it for the monomial ``prod_i x_i`` (deletion) and the binomial
``prod_{S1 u S2} x + prod_{S2 u S3} x`` (insertion) at ``x = 1``.

Two ways to the same minima are offered:

* ``method="enumerate"``: the appendix LP over all ``2^d`` subsets, solved with HiGHS (small ``d``).
* ``method="symmetric"``: the objective is convex and invariant under permuting features that play
  the same role, so averaging any optimum over those permutations gives an optimum that is
  constant on each role class. Only the *number* of chosen features per class matters then, and
  the ``2^d`` rows collapse to ``d + 1`` (monomial) or ``(b + 1)^3`` (binomial) rows weighted by
  binomial coefficients. For the monomial the 1-D problem is a weighted median solved exactly in
  rationals; for the binomial a 3-variable LP (d = 90 in well under a second). For equal blocks the
  binomial minimum is ``2^(d/3 + 1)`` (d >= 6), proved by an explicit dual point.

Mean-squared variants replace ``|.|`` by ``(.)^2``; their minima have closed forms.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, NamedTuple, cast

import numpy as np

from ..checks import check_choice, check_int

Kind = Literal["monomial-deletion", "binomial-insertion"]
KINDS: tuple[Kind, ...] = ("monomial-deletion", "binomial-insertion")
METHODS = ("symmetric", "enumerate")
MAX_ENUMERATED_D = 20
PAPER_FITS: dict[tuple[Kind, bool], tuple[float, float, float]] = {
    ("monomial-deletion", False): (-1.030, -1.171, 0.665),
    ("binomial-insertion", False): (4.778, 1.332, 0.198),
    ("monomial-deletion", True): (-1.104, -1.720, 0.626),
    ("binomial-insertion", True): (6.451, 1.457, 0.192),
}
Blocks = tuple[int, int, int]
Number = int | float | Fraction


def binomial_blocks(d: int, *, equal_blocks: bool = True) -> Blocks:
    """Sizes of ``(S1, S2, S3)`` for the binomial on ``d`` features.

    With ``equal_blocks`` ``d`` must be a multiple of 3 (the paper's lemma); otherwise the blocks are
    near-equal, larger ones first (``numpy.array_split``), which is how the paper's d = 2..20 fit
    is reproduced.
    """
    d = check_int("d", d, 1 if equal_blocks else 2)
    if equal_blocks and d % 3:
        raise ValueError(
            f"d must be a positive multiple of 3 for the binomial with equal blocks S1, S2, S3, got {d}; "
            "pass equal_blocks=False for near-equal blocks"
        )
    q, r = divmod(d, 3)
    return q + (r > 0), q + (r > 1), q


# --------------------------------------------------------------------------- LP and least squares


class Optimum(NamedTuple):
    """Minimum total error and an ``alpha`` attaining it."""

    error: float
    alpha: np.ndarray


def min_weighted_abs_error(A: np.ndarray, c: np.ndarray, w: np.ndarray | None = None) -> Optimum:
    """Solve ``min_alpha sum_j w_j |c_j - A_j alpha|`` with HiGHS through its dual.

    The dual is the paper's ``max_y c^T y`` s.t. ``A^T y = 0``, ``|y_j| <= w_j``: one variable per
    row but only ``A.shape[1]`` equality constraints. ``alpha`` is read off the equality marginals.
    """
    from scipy.optimize import linprog  # scipy is optional (the 'theory' extra): imported when solving

    A = np.asarray(A, dtype=float)
    c = np.asarray(c, dtype=float)
    w = np.ones(len(c)) if w is None else np.asarray(w, dtype=float)
    scale = w.max()
    bounds = np.column_stack([-w / scale, w / scale])
    res = linprog(-c, A_eq=A.T, b_eq=np.zeros(A.shape[1]), bounds=bounds, method="highs-ipm")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the error LP: {res.message}")
    return Optimum(-res.fun * scale, -np.asarray(res.eqlin.marginals))


def min_weighted_squared_error(A: np.ndarray, c: np.ndarray, w: np.ndarray | None = None) -> Optimum:
    """Solve ``min_alpha sum_j w_j (c_j - A_j alpha)^2`` by weighted least squares."""
    A = np.asarray(A, dtype=float)
    c = np.asarray(c, dtype=float)
    root = np.ones(len(c)) if w is None else np.sqrt(np.asarray(w, dtype=float))
    alpha = np.linalg.lstsq(A * root[:, None], c * root, rcond=None)[0]
    return Optimum(float(np.sum((root * (c - A @ alpha)) ** 2)), alpha)


def subset_matrix(d: int) -> np.ndarray:
    """``M`` of the appendix: row ``s`` is the indicator of the subset with bitmask ``s``."""
    d = check_int("d", d, 1)
    if d > MAX_ENUMERATED_D:
        raise ValueError(
            f"d must be <= {MAX_ENUMERATED_D} to enumerate all 2^d subsets, got {d}; use method='symmetric'"
        )
    return ((np.arange(2**d)[:, None] >> np.arange(d)) & 1).astype(np.float64)


# --------------------------------------------------------------------------- the paper's two problems


def monomial_deletion_targets(d: int) -> tuple[np.ndarray, np.ndarray]:
    """``(M, c)`` for deleting subsets from ``prod_i x_i`` at ``x = 1``: ``c_S = 1[S != {}]``."""
    M = subset_matrix(d)
    return M, (M.sum(axis=1) > 0).astype(np.float64)


def binomial_insertion_targets(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """``(M, c)`` for inserting subsets into the binomial with block sizes ``blocks`` at ``x = 1``."""
    n1, n2, _ = blocks
    M = subset_matrix(sum(blocks))
    c = M[:, : n1 + n2].all(axis=1).astype(np.float64) + M[:, n1:].all(axis=1)
    # numpy's stubs type a row-wise ``all(axis=1)`` as possibly a scalar; ``M`` is 2-D, so ``c`` is an array.
    return M, cast(np.ndarray, c)


def _binomial_class_rows(blocks: Blocks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``(k1, k2, k3)`` (chosen features per block), their targets and subset counts."""
    k = np.stack(np.meshgrid(*(np.arange(n + 1) for n in blocks), indexing="ij"), axis=-1).reshape(-1, 3)
    full = k == np.array(blocks)
    c = (full[:, 0] & full[:, 1]).astype(np.float64) + (full[:, 1] & full[:, 2])
    counts = [np.array([math.comb(n, j) for j in range(n + 1)], dtype=np.float64) for n in blocks]
    w = counts[0][k[:, 0]] * counts[1][k[:, 1]] * counts[2][k[:, 2]]
    return k.astype(np.float64), c, w


def monomial_deletion_exact(d: int) -> Fraction:
    """Exact minimum total deletion error of a per-feature SANN on ``prod_i x_i`` (symmetric method).

    With ``alpha = a 1`` the error is ``sum_k C(d,k) |1 - k a|`` over subset sizes ``k >= 1``: a
    weighted L1 problem in ``a`` whose minimum sits at a breakpoint ``a = 1/j``.
    """
    d = check_int("d", d, 1)
    binom = [math.comb(d, k) for k in range(d + 1)]
    return min(Fraction(sum(binom[k] * abs(j - k) for k in range(1, d + 1)), j) for j in range(1, d + 1))


def monomial_deletion_mse(d: int) -> Fraction:
    """Exact minimum total squared deletion error on ``prod_i x_i``: ``2^d / (d + 1) - 1``.

    The least-squares optimum is ``alpha = 2 / (d + 1)`` per feature (``alpha* = (M^T M)^-1 M^T c``).
    """
    d = check_int("d", d, 1)
    return Fraction(2**d, d + 1) - 1


def binomial_insertion_symmetric(d: int, *, equal_blocks: bool = True) -> float:
    """Minimum total insertion error on the binomial via the block-symmetric 3-variable LP."""
    k, c, w = _binomial_class_rows(binomial_blocks(d, equal_blocks=equal_blocks))
    return min_weighted_abs_error(k, c, w).error


def binomial_insertion_closed_form(d: int) -> int:
    """Minimum total insertion error on the equal-block binomial: 2 for d = 3, else ``2^(d/3 + 1)``.

    ``alpha = 0`` attains ``sum_S c_S = 2^(b+1)`` (``b = d/3``). For ``b >= 2`` a dual point of the
    same value proves optimality: ``y_S = 1`` where ``c_S > 0``; for the other nonempty ``S``,
    ``y_S = -x [S proper subset of S1 u S2] - x [S proper subset of S2 u S3] - z [S subset of S1 u S3]``
    with ``x = (2^(b+1) - 1) / (2^(2b) - 2)`` and ``z = (2^b - 1) / 4^b``; then ``M^T y = 0`` and
    ``|y_S| <= 1`` (the tightest case, ``S`` inside ``S2``, needs ``2x <= 1``, i.e. ``b >= 2``).
    """
    b = binomial_blocks(d)[0]
    return 2 if b == 1 else 2 ** (b + 1)


def binomial_insertion_mse(d: int, *, equal_blocks: bool = True) -> Fraction:
    """Exact minimum total squared insertion error on the binomial.

    ``M^T M = 2^(d-2) (I + J)``, so ``min = c^T c - v^T (M^T M)^-1 v`` with ``v = M^T c`` constant on
    each block; for equal blocks this is ``2^(b+1) + 2 - 2^(1-b) b (b + 17) / (3b + 1)``.
    """
    blocks = binomial_blocks(d, equal_blocks=equal_blocks)
    n1, n3, d = blocks[0], blocks[2], sum(blocks)
    v = (2**n3 + Fraction(2**n1, 2), Fraction(2**n3 + 2**n1), Fraction(2**n3, 2) + 2**n1)
    total = sum(n * vi for n, vi in zip(blocks, v))
    quad = sum(n * vi * vi for n, vi in zip(blocks, v))
    return 2**n1 + 2**n3 + 2 - Fraction(4, 2**d) * (quad - total * total / (d + 1))


def min_total_error(
    kind: Kind, d: int, *, mse: bool = False, method: str = "symmetric", equal_blocks: bool = True
) -> float:
    """Minimum total error of any per-feature SANN for ``kind`` at dimension ``d``.

    ``method="symmetric"`` uses the exact reductions (closed forms for ``mse``), ``"enumerate"``
    the appendix programs over all ``2^d`` subsets (``d <= MAX_ENUMERATED_D``).
    """
    kind, method = check_choice("kind", kind, KINDS), check_choice("method", method, METHODS)
    if method == "symmetric":
        if kind == "monomial-deletion":
            return float(monomial_deletion_mse(d) if mse else monomial_deletion_exact(d))
        if mse:
            return float(binomial_insertion_mse(d, equal_blocks=equal_blocks))
        return binomial_insertion_symmetric(d, equal_blocks=equal_blocks)
    if kind == "monomial-deletion":
        M, c = monomial_deletion_targets(d)
    else:
        M, c = binomial_insertion_targets(binomial_blocks(d, equal_blocks=equal_blocks))
    solve = min_weighted_squared_error if mse else min_weighted_abs_error
    return solve(M, c).error


# --------------------------------------------------------------------------- general polynomials


@dataclass(frozen=True)
class Polynomial:
    """``p(x) = sum_t coef_t prod_j x_j^e_tj`` on ``d`` features, with exact rational coefficients."""

    d: int
    terms: tuple[tuple[Fraction, tuple[tuple[int, int], ...]], ...]

    @classmethod
    def from_terms(cls, d: int, terms: Iterable[tuple[Number, Mapping[int, int] | Iterable[int]]]) -> Polynomial:
        """Build from ``(coefficient, features)`` pairs.

        ``features`` maps feature index to exponent, or lists indices (a repeated index raises its power).
        """
        d = check_int("d", d, 1)
        return cls(d, tuple(_parse_term(d, coef, feats) for coef, feats in terms))

    def support(self, term: int) -> frozenset[int]:
        """Features a term depends on."""
        return frozenset(j for j, _ in self.terms[term][1])

    def term_values(self, x: Sequence[Number] | None = None) -> list[Fraction]:
        """Exact value of every term at ``x`` (default all ones)."""
        xs = _exact_point(self.d, x)
        return [coef * math.prod((xs[j] ** e for j, e in powers), start=Fraction(1)) for coef, powers in self.terms]

    def __call__(self, x: Sequence[Number] | None = None) -> Fraction:
        return sum(self.term_values(x), Fraction(0))


def _exact(name: str, value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (numbers.Rational, float)):
        raise TypeError(f"{name} must be an int, float or Fraction, got {value!r} ({type(value).__name__})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return Fraction(value)


def _parse_term(d: int, coef: Number, feats: Mapping[int, int] | Iterable[int]) -> tuple[Fraction, tuple]:
    powers = dict(feats) if isinstance(feats, Mapping) else Counter(feats)
    for j, e in powers.items():
        check_int("feature index", j, 0, d - 1)
        check_int(f"exponent of feature {j}", e, 1)
    return _exact("coefficient", coef), tuple(sorted((int(j), int(e)) for j, e in powers.items()))


def _exact_point(d: int, x: Sequence[Number] | None) -> list[Fraction]:
    if x is None:
        return [Fraction(1)] * d
    if len(x) != d:
        raise ValueError(f"x must have d = {d} entries, got {len(x)}")
    return [_exact(f"x[{j}]", v) for j, v in enumerate(x)]


def monomial_polynomial(d: int) -> Polynomial:
    """The paper's monomial ``prod_{i<d} x_i``."""
    d = check_int("d", d, 1)
    return Polynomial.from_terms(d, [(1, range(d))])


def binomial_polynomial(d: int, *, equal_blocks: bool = True) -> Polynomial:
    """The paper's binomial ``prod_{S1 u S2} x + prod_{S2 u S3} x`` with consecutive blocks."""
    n1, n2, n3 = binomial_blocks(d, equal_blocks=equal_blocks)
    d = n1 + n2 + n3
    return Polynomial.from_terms(d, [(1, range(n1 + n2)), (1, range(n1, d))])


@dataclass(frozen=True)
class GroupModel:
    """A group-based SANN at one input: groups ``G_i`` and their contributions ``alpha_i``."""

    groups: tuple[frozenset[int], ...]
    contributions: tuple[Fraction, ...]

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.contributions):
            raise ValueError(
                "groups and contributions must have equal lengths, "
                f"got {len(self.groups)} and {len(self.contributions)}"
            )


def per_feature_model(alpha: Sequence[Number]) -> GroupModel:
    """The per-feature SANN with ``G_i = {i}`` and contributions ``alpha``."""
    return GroupModel(tuple(frozenset({i}) for i in range(len(alpha))), tuple(_exact("alpha", a) for a in alpha))


def group_construction(poly: Polynomial, x: Sequence[Number] | None = None) -> GroupModel:
    """The zero-error SANN of the paper's group lemma: one group per distinct term support.

    ``q_i`` collects the terms whose support is exactly ``G_i`` and ``alpha_i = q_i(x)``. Constant
    terms are dropped: they cancel in every insertion and deletion.
    """
    sums: dict[frozenset[int], Fraction] = {}
    for t, value in enumerate(poly.term_values(x)):
        support = poly.support(t)
        if support:
            sums[support] = sums.get(support, Fraction(0)) + value
    return GroupModel(tuple(sums), tuple(sums.values()))


def _mask(features: Iterable[int]) -> int:
    return sum(1 << j for j in features)


def _total_error(
    poly: Polynomial, model: GroupModel, x: Sequence[Number] | None, squared: bool, deletion: bool
) -> Fraction:
    if poly.d > MAX_ENUMERATED_D:
        raise ValueError(f"poly.d must be <= {MAX_ENUMERATED_D} to enumerate all 2^d subsets, got {poly.d}")
    bad = [sorted(g) for g in model.groups if any(not 0 <= j < poly.d for j in g)]
    if bad:
        raise ValueError(f"model groups must use features 0..{poly.d - 1}, got {bad}")
    terms = [(_mask(poly.support(t)), v) for t, v in enumerate(poly.term_values(x))]
    groups = [(_mask(g), a) for g, a in zip(model.groups, model.contributions)]
    hit: Callable[[int, int], bool] = (lambda m, s: m & s != 0) if deletion else (lambda m, s: m != 0 and m & s == m)
    total = Fraction(0)
    for s in range(2**poly.d):
        r = sum((v for m, v in terms if hit(m, s)), Fraction(0)) - sum((a for m, a in groups if hit(m, s)), Fraction(0))
        total += r * r if squared else abs(r)
    return total


def total_insertion_error(
    poly: Polynomial, model: GroupModel, x: Sequence[Number] | None = None, *, squared: bool = False
) -> Fraction:
    """Exact ``sum_S |p(x_S) - p(0) - sum_{G_i subset of S} alpha_i|`` over all subsets (or squared)."""
    return _total_error(poly, model, x, squared, deletion=False)


def total_deletion_error(
    poly: Polynomial, model: GroupModel, x: Sequence[Number] | None = None, *, squared: bool = False
) -> Fraction:
    """Exact ``sum_S |p(x) - p(x_{not S}) - sum_{G_i meets S} alpha_i|`` over all subsets (or squared)."""
    return _total_error(poly, model, x, squared, deletion=True)


def per_feature_targets(
    poly: Polynomial, operation: Literal["insertion", "deletion"], x: Sequence[Number] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(M, c)`` with ``c_S`` the true effect of inserting (deleting) subset ``S`` at ``x``."""
    if operation not in ("insertion", "deletion"):
        raise ValueError(f"operation must be 'insertion' or 'deletion', got {operation!r}")
    M = subset_matrix(poly.d)
    s = np.arange(2**poly.d)
    c = np.zeros(len(s))
    for t, value in enumerate(poly.term_values(x)):
        m = _mask(poly.support(t))
        hit = (s & m) != 0 if operation == "deletion" else (m != 0) & ((s & m) == m)
        c += float(value) * hit
    return M, c


def per_feature_min_error(
    poly: Polynomial,
    operation: Literal["insertion", "deletion"],
    x: Sequence[Number] | None = None,
    *,
    mse: bool = False,
) -> Optimum:
    """Minimum total insertion or deletion error of any per-feature SANN for ``poly`` at ``x``."""
    M, c = per_feature_targets(poly, operation, x)
    return (min_weighted_squared_error if mse else min_weighted_abs_error)(M, c)


# --------------------------------------------------------------------------- exponential fit


@dataclass(frozen=True)
class ExponentialFit:
    """``gamma0 + exp(gamma1 + gamma2 d)`` and its relative absolute error ``sum|fit - y| / sum|y|``."""

    gamma0: float
    gamma1: float
    gamma2: float
    relative_abs_error: float

    def __call__(self, d: np.ndarray | float) -> np.ndarray:
        return self.gamma0 + np.exp(self.gamma1 + self.gamma2 * np.asarray(d, dtype=float))


def _log_linear(ds: np.ndarray, ys: np.ndarray, gamma0: float) -> ExponentialFit:
    gamma2, gamma1 = np.polyfit(ds, np.log(ys - gamma0), 1)
    pred = gamma0 + np.exp(gamma1 + gamma2 * ds)
    return ExponentialFit(
        float(gamma0), float(gamma1), float(gamma2), float(np.abs(pred - ys).sum() / np.abs(ys).sum())
    )


def fit_exponential(ds: Sequence[float], values: Sequence[float]) -> ExponentialFit:
    """Fit ``gamma0 + exp(gamma1 + gamma2 d)`` as in the paper.

    ``(gamma1, gamma2)`` come from a linear fit of ``log(y - gamma0)``; ``gamma0 < min(y)`` is chosen
    by a log-spaced grid search refined with Brent's method, minimising the relative absolute error.
    """
    from scipy.optimize import minimize_scalar  # optional, as in min_weighted_abs_error

    x, y = np.asarray(ds, dtype=float), np.asarray(values, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 3:
        raise ValueError(f"ds and values must be 1-D of equal length >= 3, got shapes {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or np.ptp(y) == 0:
        raise ValueError("values must be finite and not all equal")
    scale = float(np.abs(y).max())
    gaps = np.geomspace(1e-9 * scale, 1e3 * scale, 481)
    errs = [_log_linear(x, y, y.min() - g).relative_abs_error for g in gaps]
    i = int(np.argmin(errs))
    lo, hi = np.log(gaps[max(i - 1, 0)]), np.log(gaps[min(i + 1, len(gaps) - 1)])
    res = minimize_scalar(
        lambda t: _log_linear(x, y, y.min() - np.exp(t)).relative_abs_error, bounds=(lo, hi), method="bounded"
    )
    best = min(res.x, np.log(gaps[i]), key=lambda t: _log_linear(x, y, y.min() - np.exp(t)).relative_abs_error)
    return _log_linear(x, y, y.min() - np.exp(best))
