"""Group selector and aggregation (docs/method.md, steps 9–10), ``torch.ops.sopfast.group_select`` and
``torch.ops.sopfast.aggregate`` (composites of torch ops and ``sparsemax``).

``c[b, :, :] = sparsemax_i(β · (C W_Qᵀ) (z[b] W_Kᵀ)ᵀ)`` over the ``m`` groups, per class, in
fp32; ``ŷ[b, c] = Σ_i c[b, c, i] · λ[b, i] · y[b, i, c]``.
"""

from __future__ import annotations

import torch

from ..checks import check_float, check_number, check_rank, check_same_device
from . import _backends
from .sparsemax import sparsemax, sparsemax_reference


def selector_scores(
    class_queries: torch.Tensor, z: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, beta: float
) -> torch.Tensor:
    """The selector's scores before the sparsemax, ``β · (C W_Qᵀ)(z W_Kᵀ)ᵀ``: ``[B, Cls, m]`` (fp32)."""
    q = class_queries.float() @ w_q.float().t()
    keys = z.float() @ w_k.float().t()
    return beta * torch.matmul(keys, q.t()).transpose(1, 2)


def _check_selector(class_queries, z, w_q, w_k) -> None:
    """The selector's tensors: float ``class_queries [Cls, H]``, ``z [B, m, H]``, ``w_q`` and ``w_k [H', H]``,
    on one device."""
    for name, t, layout in (
        ("class_queries", class_queries, "[Cls, H]"),
        ("z", z, "[B, m, H]"),
        ("w_q", w_q, "[H', H]"),
        ("w_k", w_k, "[H', H]"),
    ):
        check_rank(name, t, len(layout.split(",")), layout)
        check_float(name, t)
    check_same_device(class_queries=class_queries, z=z, w_q=w_q, w_k=w_k)
    hidden = class_queries.shape[1]
    if z.shape[2] != hidden:
        raise ValueError(f"class_queries hidden size {hidden} does not match z hidden size {z.shape[2]}")
    if w_q.shape[1] != hidden or w_k.shape != w_q.shape:
        raise ValueError(
            f"w_q and w_k must both have shape [H', H={hidden}] (H: the hidden size of class_queries and z), "
            f"got w_q {tuple(w_q.shape)} and w_k {tuple(w_k.shape)}"
        )


def _check_aggregate(c, lam, y) -> None:
    """``c [B, Cls, m]``, ``lam [B, m]`` and ``y [B, m, Cls]``: float, on one device, their sizes lining up."""
    for name, t, layout in (("c", c, "[B, Cls, m]"), ("lam", lam, "[B, m]"), ("y", y, "[B, m, Cls]")):
        check_rank(name, t, len(layout.split(",")), layout)
        check_float(name, t)
    check_same_device(c=c, lam=lam, y=y)
    if not (
        c.shape[0] == lam.shape[0] == y.shape[0]
        and c.shape[2] == lam.shape[1] == y.shape[1]
        and c.shape[1] == y.shape[2]
    ):
        raise ValueError(
            f"shapes do not line up: c {tuple(c.shape)} [B, Cls, m], lam {tuple(lam.shape)} [B, m], "
            f"y {tuple(y.shape)} [B, m, Cls]"
        )


def group_select_reference(
    class_queries: torch.Tensor, z: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, beta: float
) -> torch.Tensor:
    """Pure-PyTorch selector: ``C [Cls, H]``, ``z [B, m, H]`` → ``c [B, Cls, m]`` (fp32)."""
    _check_selector(class_queries, z, w_q, w_k)
    return sparsemax_reference(selector_scores(class_queries, z, w_q, w_k, check_number("beta", beta)))


def group_select(
    class_queries: torch.Tensor, z: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, beta: float
) -> torch.Tensor:
    """Group scores ``c [B, Cls, m]`` (fp32) from class queries ``[Cls, H]`` and keys ``z [B, m, H]``
    (``torch.ops.sopfast.group_select``, which checks the tensors too)."""
    _check_selector(class_queries, z, w_q, w_k)  # a non-tensor fails here, naming it, not in the dispatcher
    return _group_select(class_queries, z, w_q, w_k, check_number("beta", beta))


def _group_select_composite(
    class_queries: torch.Tensor, z: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, beta: float
) -> torch.Tensor:
    _check_selector(class_queries, z, w_q, w_k)
    with torch.autocast(device_type=z.device.type, enabled=False):
        return sparsemax(selector_scores(class_queries, z, w_q, w_k, beta), dim=-1)


_group_select = _backends.composite(
    "group_select",
    "(Tensor class_queries, Tensor z, Tensor w_q, Tensor w_k, float beta) -> Tensor",
    _group_select_composite,
)


def aggregate_reference(c: torch.Tensor, lam: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``ŷ [B, Cls]`` from ``c [B, Cls, m]``, ``lam [B, m]`` and ``y [B, m, Cls]``."""
    _check_aggregate(c, lam, y)
    return (c * lam.unsqueeze(1) * y.transpose(1, 2)).sum(dim=-1)


def aggregate(c: torch.Tensor, lam: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sparse weighted sum of the group logits, in fp32 (see module docstring;
    ``torch.ops.sopfast.aggregate``, which checks the tensors too)."""
    _check_aggregate(c, lam, y)  # a non-tensor fails here, naming it, not in the dispatcher
    return _aggregate(c, lam, y)


def _aggregate_composite(c: torch.Tensor, lam: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _check_aggregate(c, lam, y)
    with torch.autocast(device_type=c.device.type, enabled=False):
        return torch.einsum("bcm,bm,bmc->bc", c.float(), lam.float(), y.float())


_aggregate = _backends.composite("aggregate", "(Tensor c, Tensor lam, Tensor y) -> Tensor", _aggregate_composite)
