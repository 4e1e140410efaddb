"""Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex.

``p = sparsemax(x)`` solves ``argmin_{p ∈ Δ} ||p − x||²`` along one dimension.  Math in
fp32 (fp64 stays fp64), output in the input dtype.  Rows holding ``+inf`` put uniform mass
on their ``+inf`` entries.  **Rows without a result** — holding a NaN, or all ``−inf`` — give NaN
everywhere, on every backend (the rule of :func:`sopfast.ops.top_tau`, as ``torch.softmax`` answers
NaN).  ``torch.ops.sopfast.sparsemax`` (2-D, last dim) is the op in the dispatcher.
Backward on the support ``S = {p > 0}``: ``∂x = (g − mean_S(g)) · 1_S``.  It is linear in ``g``
(a symmetric projection) and constant in ``x`` between support changes, so the double backward
is the same projection of the incoming gradient (higher-order gradients work).
"""

from __future__ import annotations

import torch

from ..checks import check_float, check_int, check_tensor
from . import _backends
from .counts import rows_without_result


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def sparsemax_reference(x: torch.Tensor) -> torch.Tensor:
    """Sort-based sparsemax over the last dim of ``x [..., n]`` (the oracle), rows without a result NaN."""
    xf = x.to(_compute_dtype(x.dtype))
    n = xf.shape[-1]
    if xf.numel() == 0:
        return x.clone()
    posinf = torch.isposinf(xf)
    shifted = xf - xf.amax(dim=-1, keepdim=True)
    z, _ = torch.sort(shifted, dim=-1, descending=True)
    rank = torch.arange(1, n + 1, device=x.device, dtype=xf.dtype)
    cumsum = z.cumsum(dim=-1)
    support = (1 + rank * z) > cumsum
    k = support.sum(dim=-1, keepdim=True).clamp_min(1)
    threshold = (cumsum.gather(-1, k - 1) - 1) / k.to(xf.dtype)
    p = torch.clamp(shifted - threshold, min=0)
    n_inf = posinf.sum(dim=-1, keepdim=True)
    p = torch.where(n_inf > 0, posinf.to(xf.dtype) / n_inf.clamp_min(1), p)
    undefined = rows_without_result(xf.reshape(-1, n)).view(*xf.shape[:-1], 1)
    return p.masked_fill(undefined, float("nan")).to(x.dtype)


def sparsemax_backward_reference(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Gradient of sparsemax w.r.t. its input, given the output ``p`` and ``grad`` (same shape)."""
    gf = grad.to(_compute_dtype(grad.dtype))
    support = (p > 0).to(gf.dtype)
    size = support.sum(dim=-1, keepdim=True).clamp_min(1)
    mean = (gf * support).sum(dim=-1, keepdim=True) / size
    return ((gf - mean) * support).to(grad.dtype)


# torch.ops.sopfast.sparsemax / sparsemax_backward on contiguous 2-D [N, n]; the references look the
# module's functions up at call time (tests replace them)
_forward = _backends.Op(
    "sparsemax",
    "(Tensor x) -> Tensor",
    "sparsemax_forward",
    lambda x: sparsemax_reference(x),
    lambda x: torch.empty_like(x),
).overload
_backends.Op(
    "sparsemax_backward",
    "(Tensor p, Tensor grad) -> Tensor",
    "sparsemax_backward",
    lambda p, grad: sparsemax_backward_reference(p, grad),
    lambda p, grad: torch.empty_like(grad),
)


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax of ``x`` along ``dim``; same shape and dtype as ``x``."""
    _backends.check_extension()
    if (
        type(x) is torch.Tensor
        and x.dim() == 2
        and type(dim) is int
        and dim in (-1, 1)
        and x.is_floating_point()
        and x.shape[1]
    ):
        return _forward(x)  # the common case, checked by the kernel
    check_tensor("x", x)
    check_float("x", x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension, got a scalar")
    dim = check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be in [{-x.dim()}, {x.dim() - 1}] for x of shape {tuple(x.shape)}, got {dim}")
    if x.shape[dim] == 0:
        raise ValueError(f"sparsemax needs at least one entry along dim {dim}, got shape {tuple(x.shape)}")
    moved = x.movedim(dim, -1)
    p = _forward(moved.reshape(-1, moved.shape[-1]).contiguous())
    return p.reshape(moved.shape).movedim(-1, dim)
