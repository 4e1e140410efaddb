"""Fused top-τ group binarisation: blur → softmax → top-k → mask, indices and λ.

For each logit row ``s [d]`` (one group's attention logits over the ``d`` features):

1. optional Gaussian blur on the key grid (:mod:`sopfast.ops.blur`);
2. ``a = softmax(s)`` over the valid keys (invalid keys get ``a = 0``; ``+inf`` logits
   share the mass uniformly); subnormal values are kept, as ``torch.softmax`` keeps them;
3. the group keeps the ``k`` valid features with the largest (``largest=False``: smallest)
   attention.  How equal values are ordered is ``ties``:

   * ``"authors"`` (default) – rank the fp32 softmax values ``a`` as the authors' code does
     (a stable ascending sort, flipped for ``largest``): among equal ``a`` — including
     attention that underflows to exactly 0 — the **higher** feature index comes first
     (``largest=False``: the lower);
   * ``"logits"`` – rank the blurred logits (the same order without softmax rounding),
     ties to the lower feature index: the paper's math at infinite precision;
4. ``λ = Σ_{j∈g} a_j − Σ_{j∉g} a_j = 2 Σ_{j∈g} a_j − 1``.

A caller that needs only the groups asks for less: ``attention=False`` writes no attention (λ's
gradient still works: the autograd keeps what its backward needs) and ``index_dtype=torch.int32`` halves
the indices — the kernels' traffic at SOP's shapes is then mostly the logits read once.

``k = max(1, floor(τ · d))`` is computed exactly, ``τ`` read as the decimal it prints as.  Every
argument is validated here, before dispatch, so all backends accept and reject alike.

**Rows without a result.**  A row holding NaN among its valid features, or with every valid
feature at ``−inf`` (with blur: any NaN or infinity in the row), has no softmax and no top-τ.
Such a row gets NaN ``λ`` and NaN attention and an empty group (``mask`` all False, ``indices``
all ``-1``), on every backend (the rule is applied here, after the kernel, without a host sync) —
as ``torch.softmax`` answers NaN.  An SOP model
built on such rows predicts NaN, and :func:`sopfast.train` stops with an error naming the step.

Backward (w.r.t. the un-blurred logits) chains ``∂λ/∂s_j = a_j (σ_j − λ)`` with
``σ_j = ±1`` inside/outside the group, plus the softmax backward when the attention output
is used, through the adjoint of the blur.  Under ``create_graph`` the backward runs as
differentiable torch ops, so second derivatives work on every backend.  The kernels' softmax is
torch's up to rounding: the authors' rule may order two attention values that differ only in the
last bit differently from ``torch.sort`` on torch's softmax.
"""

from __future__ import annotations

import numbers
from functools import lru_cache
from typing import NamedTuple

import torch

from ..checks import (
    FLOAT_DTYPES,
    check_float,
    check_grid,
    check_int,
    check_number,
    check_rank,
    check_same_device,
    check_tau,
    check_tensor,
    check_values,
)
from . import _backends
from .blur import blur_adjoint_reference, blur_reference, check_blur_fits, gaussian_kernel1d
from .counts import canonical_for_sort, num_kept, num_kept_table, rows_without_result


class TopTauResult(NamedTuple):
    """``indices [N, k_max]`` int64 (or the ``index_dtype`` asked) ascending (``-1``-padded when rows
    keep fewer; ``k_max`` is ``num_kept(tau, d)`` or ``k``, or a tensor ``k``'s maximum),
    ``mask [N, d]`` bool, ``lam [N]`` and ``attention [N, d]`` (fp32; fp64 for fp64 input; ``None``
    when not asked)."""

    indices: torch.Tensor
    mask: torch.Tensor
    lam: torch.Tensor
    attention: torch.Tensor | None


def _grid_or_none(grid_h: int, grid_w: int) -> tuple[int, int] | None:
    return (grid_h, grid_w) if grid_h > 0 and grid_w > 0 else None


def _softmax_with_inf(s: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim where rows holding +inf spread mass over their +inf entries."""
    posinf = torch.isposinf(s)
    n_inf = posinf.sum(dim=-1, keepdim=True)
    a = torch.softmax(torch.where(posinf, torch.zeros_like(s), s), dim=-1)
    return torch.where(n_inf > 0, posinf.to(s.dtype) / n_inf.clamp_min(1), a)


TIES = ("authors", "logits")
INDEX_DTYPES = (torch.int64, torch.int32)


def _ranking(scores: torch.Tensor, valid: torch.Tensor, largest: bool, higher_first: bool) -> torch.Tensor:
    """Feature order per row: valid first, then by score; equal scores in index order, or in
    reverse index order when ``higher_first``."""
    scores = canonical_for_sort(scores)
    if higher_first:
        d = scores.shape[-1]
        order = (d - 1) - torch.sort(scores.flip(-1), dim=-1, descending=largest, stable=True).indices
    else:
        order = torch.sort(scores, dim=-1, descending=largest, stable=True).indices
    invalid_in_order = (~valid).gather(-1, order).to(torch.uint8)
    return order.gather(-1, torch.sort(invalid_in_order, dim=-1, stable=True).indices)


def top_tau_reference(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    k_max: int,
    valid: torch.Tensor | None = None,
    largest: bool = True,
    blur_kernel: torch.Tensor | None = None,
    grid_h: int = 0,
    grid_w: int = 0,
    ties_authors: bool = False,
    need_attention: bool = True,
    int32_indices: bool = False,
) -> TopTauResult:
    """Pure-PyTorch top-τ on ``logits [N, d]`` with per-row ``k [N]`` (``None``: ``k_max`` in every
    row); differentiable in ``lam`` and ``attention`` through autograd (the oracle for the kernels'
    backward).  Rows without a result keep no feature and get NaN ``lam`` and attention.

    ``ties_authors`` ranks the attention with the authors' tie rule (higher index first for
    ``largest``), else the blurred logits with ties to the lower index (see the module docstring).
    Without ``need_attention`` the attention is ``[N, 0]``; ``int32_indices`` gives int32 indices."""
    n, d = logits.shape
    if k is None:
        k = torch.full((n,), k_max, dtype=torch.int64, device=logits.device)
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    s = logits.to(compute)
    if blur_kernel is not None:
        s = blur_reference(s, blur_kernel, _grid_or_none(grid_h, grid_w))
    if valid is None:
        valid = torch.ones(n, d, dtype=torch.bool, device=logits.device)
    a = _softmax_with_inf(s.masked_fill(~valid, float("-inf")))
    if ties_authors:
        order = _ranking(a.detach(), valid, largest, higher_first=largest)
    else:
        order = _ranking(s.detach(), valid, largest, higher_first=False)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(d, device=logits.device).expand(n, d))
    mask = rank < k.view(-1, 1)
    lam = 2 * (a * mask).sum(dim=-1) - 1
    positions = torch.arange(d, device=logits.device).expand(n, d)
    keyed = torch.where(mask, positions, d + positions)
    indices = torch.sort(keyed, dim=-1).values[:, :k_max]
    undefined = rows_without_result(logits, valid, blurred=blur_kernel is not None)
    row = undefined.view(-1, 1)
    indices = torch.where((indices < d) & ~row, indices, torch.full_like(indices, -1))
    lam = lam.masked_fill(undefined, float("nan"))
    attention = a.masked_fill(row, float("nan"))
    return TopTauResult(
        indices.int() if int32_indices else indices,
        mask & ~row,
        lam,
        attention if need_attention else attention[:, :0],
    )


def top_tau_backward_reference(
    attention: torch.Tensor,
    mask: torch.Tensor,
    lam: torch.Tensor,
    grad_lam: torch.Tensor,
    grad_attention: torch.Tensor | None,
    blur_kernel: torch.Tensor | None = None,
    grid_h: int = 0,
    grid_w: int = 0,
) -> torch.Tensor:
    """Closed-form gradient w.r.t. the un-blurred logits ``[N, d]`` (fp32/fp64)."""
    a = attention
    sign = mask.to(a.dtype) * 2 - 1
    g = a * (grad_lam.to(a.dtype).view(-1, 1) * (sign - lam.view(-1, 1)))
    if grad_attention is not None:
        ga = grad_attention.to(a.dtype)
        g = g + a * (ga - (a * ga).sum(dim=-1, keepdim=True))
    if blur_kernel is not None:
        g = blur_adjoint_reference(g, blur_kernel, _grid_or_none(grid_h, grid_w))
    return g


def _fake(logits, k, k_max, valid, largest, ties_authors, blur_kernel, grid_h, grid_w, attention=True, int32=False):
    n, d = logits.shape
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return (
        logits.new_empty(n, k_max, dtype=torch.int32 if int32 else torch.int64),
        logits.new_empty(n, d, dtype=torch.bool),
        logits.new_empty(n, dtype=compute),
        logits.new_empty(n, d if attention else 0, dtype=compute),
    )


def _reference_op(logits, k, k_max, valid, largest, ties_authors, blur, grid_h, grid_w, attention=True, int32=False):
    """:func:`top_tau_reference` with the op's argument order."""
    return tuple(
        top_tau_reference(logits, k, k_max, valid, largest, blur, grid_h, grid_w, ties_authors, attention, int32)
    )


# torch.ops.sopfast.top_tau / top_tau_backward; the references look the module's functions up at call
# time (tests replace them)
_forward = _backends.Op(
    "top_tau",
    "(Tensor logits, Tensor? k, int k_max, Tensor? valid, bool largest, bool ties_authors, Tensor? blur_kernel, "
    "int grid_h, int grid_w, bool need_attention=True, bool int32_indices=False) -> (Tensor, Tensor, Tensor, Tensor)",
    "top_tau_forward",
    _reference_op,
    _fake,
).overload
_backends.Op(
    "top_tau_backward",
    "(Tensor attention, Tensor mask, Tensor lam, Tensor grad_lam, Tensor? grad_attention, Tensor? blur_kernel, "
    "int grid_h, int grid_w) -> Tensor",
    "top_tau_backward",
    lambda *args: top_tau_backward_reference(*args),
    lambda attention, *_: torch.empty_like(attention),
)


def _check_k(k: object, logits: torch.Tensor) -> int | torch.Tensor:
    """``k``: an integer, or an integer tensor of shape ``[]`` or ``[N]`` on the logits' device (never a
    float or a bool; not on ``meta``: the output width is its maximum)."""
    if isinstance(k, torch.Tensor):
        n = logits.shape[0]
        if k.dtype == torch.bool or k.is_floating_point() or k.is_complex():
            raise TypeError(f"k must be an integer tensor (a count per row), got dtype {k.dtype}")
        if k.dim() > 1 or (k.dim() == 1 and k.shape[0] != n):
            raise ValueError(f"k must be a scalar or have shape [N]=[{n}], got shape {tuple(k.shape)}")
        check_same_device(logits=logits, k=k)
        if k.device.type == "meta":
            raise ValueError("k must be an int or a tensor with values (its maximum is the output width), got meta")
        return k
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(
            f"k must be an integer (features per row) or an integer tensor [N], got {k!r} ({type(k).__name__})"
        )
    return int(k)


def _kept_table(tau: float, d: int, device: torch.device) -> torch.Tensor:
    """:func:`num_kept_table` as an int64 tensor ``[d + 1]`` on ``device``, copied without waiting (a plain
    ``torch.tensor(..., device=cuda)`` copy synchronises)."""
    return torch.tensor(num_kept_table(tau, d), dtype=torch.int64).to(device, non_blocking=True)


def _resolve_k(
    tau: float | None, k: int | torch.Tensor | None, logits: torch.Tensor, valid: torch.Tensor | None
) -> tuple[torch.Tensor | None, int]:
    """Per-row counts ``k [N]`` (int64; ``None`` when every row keeps ``k_max``) and the output width
    ``k_max``.  With ``tau`` or an int ``k`` the width is known on the host (``num_kept(tau, d)`` or
    ``k``: no row keeps more) and ``valid`` is checked on the device; only a tensor ``k`` (on the logits'
    device) costs one device-to-host transfer (its maximum, with the checks)."""
    if (tau is None) == (k is None):
        raise ValueError("give exactly one of tau (a fraction in (0, 1]) or k (a feature count)")
    n, d = logits.shape
    if tau is not None:
        tau = tau if type(tau) is float and 0.0 < tau <= 1.0 else check_tau(tau)
        k_max = num_kept(tau, d) if torch.compiler.is_compiling() else _num_kept_cached(tau, d)
        if valid is None:
            return None, k_max
        counts = valid.sum(dim=-1)
        check_values(
            (counts > 0).all(),
            "every row of valid must allow at least one feature",
            lambda: f", got {int((counts == 0).sum())} rows without one",
        )
        return _kept_table(tau, d, counts.device)[counts], k_max
    k = _check_k(k, logits)
    if isinstance(k, int):
        if not 1 <= k <= d:
            raise ValueError(f"k must lie in [1, number of valid features per row ({d} at most)], got {k}")
        if valid is not None:
            check_values(
                (valid.sum(dim=-1) >= k).all(),
                f"k must lie in [1, number of valid features per row ({d} at most)], got {k}",
            )
        return None, k
    k_rows = k.to(dtype=torch.int64).expand(n).contiguous()
    counts = valid.sum(dim=-1) if valid is not None else torch.full((n,), d, device=logits.device)
    if not n:
        return k_rows, 0
    k_max, out_of_range = torch.stack([k_rows.max(), ((k_rows < 1) | (k_rows > counts)).sum()]).tolist()
    if out_of_range:
        raise ValueError(f"k must lie in [1, number of valid features per row ({d} at most)], got {k}")
    return k_rows, k_max


def top_tau(
    logits: torch.Tensor,
    tau: float | None = None,
    *,
    k: int | torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    largest: bool = True,
    ties: str = "authors",
    blur_kernel_size: int = 0,
    blur_sigma: float = 1.0,
    grid: tuple[int, int] | None = None,
    attention: bool = True,
    index_dtype: torch.dtype = torch.int64,
) -> TopTauResult:
    """Binarise attention rows into groups (``torch.ops.sopfast.top_tau`` after the checks).

    Args:
        logits: ``[N, d]`` attention logits (one row per group), any float dtype.
        tau: keep ``k = max(1, floor(tau · d))`` features per row (``d`` = valid count).
        k: or an explicit count (int or ``[N]``), instead of ``tau``.
        valid: optional ``[N, d]`` bool; invalid features are never kept and get ``a = 0``.
        largest: keep the highest-attention features (``False``: the lowest, for deletion).
        ties: ``"authors"`` (rank the fp32 attention; equal values → higher index first, as
            the authors' code) or ``"logits"`` (rank the blurred logits; ties → lower index).
        blur_kernel_size, blur_sigma: Gaussian blur of each row before the softmax
            (``kernel_size <= 1`` disables it).
        grid: ``(h, w)`` with ``h · w = d`` to blur on a 2-D grid; ``None`` blurs along ``d``.
        attention: return the attention rows (``False``: ``None``, and the kernels write none).
        index_dtype: ``torch.int64`` or ``torch.int32``, the indices' dtype.
    """
    _backends.check_extension()
    if not (type(logits) is torch.Tensor and logits.dtype in FLOAT_DTYPES and logits.dim() == 2):
        check_float("logits", logits)
        check_rank("logits", logits, 2, "[N, d]")
    if ties not in TIES:
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
    if largest is not True and largest is not False:
        raise TypeError(f"largest must be True or False, got {largest!r}")
    if attention is not True and attention is not False:
        raise TypeError(f"attention must be True or False, got {attention!r}")
    if index_dtype not in INDEX_DTYPES:
        raise ValueError(f"index_dtype must be one of {INDEX_DTYPES}, got {index_dtype!r}")
    d = logits.shape[1]
    if d == 0:
        raise ValueError(f"logits must have at least one feature per row, got shape {tuple(logits.shape)}")
    if valid is not None:
        check_tensor("valid", valid)
        if valid.dtype != torch.bool or valid.shape != logits.shape:
            raise ValueError(
                f"valid must be a bool tensor of the logits' shape {tuple(logits.shape)}, "
                f"got {valid.dtype} {tuple(valid.shape)}"
            )
        check_same_device(logits=logits, valid=valid)
    grid_h, grid_w = check_grid(grid, d) if grid is not None else (0, 0)
    blur_kernel = None
    if type(blur_kernel_size) is not int or blur_kernel_size > 1 or type(blur_sigma) is not float or blur_sigma != 1:
        blur_kernel_size = check_int("blur_kernel_size", blur_kernel_size)
        blur_sigma = check_number("blur_sigma", blur_sigma, 0.0, above=True)
        if blur_kernel_size > 1:
            check_blur_fits(blur_kernel_size, (grid_h, grid_w) if grid is not None else (d,))
            blur = _blur_kernel.__wrapped__ if torch.compiler.is_compiling() else _blur_kernel
            blur_kernel = blur(blur_kernel_size, blur_sigma, logits.device, logits.dtype == torch.float64)
    k_rows, k_max = _resolve_k(tau, k, logits, valid)
    if attention and index_dtype is torch.int64:
        return TopTauResult._make(
            _forward(logits, k_rows, k_max, valid, largest, ties == "authors", blur_kernel, grid_h, grid_w)
        )
    indices, mask, lam, rows = _forward(
        logits,
        k_rows,
        k_max,
        valid,
        largest,
        ties == "authors",
        blur_kernel,
        grid_h,
        grid_w,
        attention,
        index_dtype is torch.int32,
    )
    return TopTauResult(indices, mask, lam, rows if attention else None)


_num_kept_cached = lru_cache(maxsize=256)(num_kept)  # eager calls: the Fraction arithmetic once per (tau, d)


@lru_cache(maxsize=32)
def _blur_kernel(kernel_size: int, sigma: float, device: torch.device, double: bool) -> torch.Tensor:
    """:func:`gaussian_kernel1d` (fp64 for fp64 logits), built once per size, sigma and device."""
    kernel = gaussian_kernel1d(kernel_size, sigma, device)
    return kernel.double() if double else kernel
