"""Token gather for group execution: ``[B, T, E]`` → ``[B·m, p + k, E]``.

Row ``b·m + i`` of the output holds the ``p`` always-kept prefix tokens ``x[b, :p]``
(e.g. CLS) followed by the tokens ``x[b, indices[b, i]]``; an index of ``-1`` is padding
and gives a zero row.  Never materialises ``[B, m, T, E]``.  Backward is a scatter-add into
``[B, T, E]`` accumulated in fp32 (fp64 for fp64); being linear in the incoming gradient, its own
backward is the gather again (higher-order gradients work).
"""

from __future__ import annotations

import torch

from ..checks import check_float, check_int, check_rank, check_same_device, check_tensor, check_values
from . import _backends


def gather_tokens_reference(x: torch.Tensor, indices: torch.Tensor, prefix: int = 0) -> torch.Tensor:
    """Pure-PyTorch gather (the oracle): ``x [B, T, E]``, ``indices [B, m, k]`` → ``[B·m, p+k, E]``.

    Checks the indices (integers in ``[-1, T)``: an index ``T`` would read the next example's first token)
    and ``prefix`` as :func:`gather_tokens` does."""
    b, t, e = x.shape
    prefix = _check_indices_and_prefix(indices, prefix, t)
    _, m, k = indices.shape
    pad = indices < 0
    flat = (indices.clamp_min(0) + torch.arange(b, device=x.device).view(b, 1, 1) * t).reshape(-1)
    picked = x.reshape(b * t, e).index_select(0, flat).reshape(b * m, k, e)
    picked = picked.masked_fill(pad.reshape(b * m, k, 1), 0)
    if prefix == 0:
        return picked
    head = x[:, :prefix].unsqueeze(1).expand(b, m, prefix, e).reshape(b * m, prefix, e)
    return torch.cat([head, picked], dim=1)


def gather_tokens_backward_reference(
    grad: torch.Tensor, indices: torch.Tensor, prefix: int, num_tokens: int
) -> torch.Tensor:
    """Scatter-add of ``grad [B·m, p+k, E]`` back to ``[B, T, E]`` (fp32 accumulation; fp64 for fp64)."""
    b, m, k = indices.shape
    e = grad.shape[-1]
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    acc = torch.zeros(b, num_tokens, e, dtype=acc_dtype, device=grad.device)
    g = grad.reshape(b, m, prefix + k, e).to(acc_dtype)
    if prefix:
        acc[:, :prefix] += g[:, :, :prefix].sum(dim=1)
    body = g[:, :, prefix:].masked_fill((indices < 0).unsqueeze(-1), 0).reshape(b, m * k, e)
    acc.scatter_add_(1, indices.clamp_min(0).reshape(b, m * k, 1).expand(b, m * k, e), body)
    return acc.to(grad.dtype)


# the reference entries look the module's functions up at call time (tests replace them)
_forward = _backends.Op("gather_tokens_forward", lambda *args: gather_tokens_reference(*args))
_backward = _backends.Op("gather_tokens_backward", lambda *args: gather_tokens_backward_reference(*args))


@torch.library.custom_op("sopfast::gather_tokens_forward", mutates_args=())
def gather_tokens_forward(x: torch.Tensor, indices: torch.Tensor, prefix: int) -> torch.Tensor:
    """Gather on contiguous ``x [B, T, E]`` and int64 ``indices [B, m, k]`` on the active backend."""
    return _forward(x, indices, prefix)


@gather_tokens_forward.register_fake
def _(x, indices, prefix):
    b, m, k = indices.shape
    return x.new_empty(b * m, prefix + k, x.shape[-1])


@torch.library.custom_op("sopfast::gather_tokens_backward", mutates_args=())
def gather_tokens_backward(grad: torch.Tensor, indices: torch.Tensor, prefix: int, num_tokens: int) -> torch.Tensor:
    """Scatter-add backward on the active backend."""
    return _backward(grad, indices, prefix, num_tokens)


@gather_tokens_backward.register_fake
def _(grad, indices, prefix, num_tokens):
    b = indices.shape[0]
    return grad.new_empty(b, num_tokens, grad.shape[-1])


class GatherTokensBackwardFunction(torch.autograd.Function):
    """The scatter-add as a differentiable function of the incoming gradient (adjoint: the gather)."""

    @staticmethod
    def forward(ctx, grad: torch.Tensor, indices: torch.Tensor, prefix: int, num_tokens: int) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.prefix = prefix
        return torch.ops.sopfast.gather_tokens_backward(grad, indices, prefix, num_tokens)

    @staticmethod
    def backward(ctx, grad_grad: torch.Tensor):
        (indices,) = ctx.saved_tensors
        return torch.ops.sopfast.gather_tokens_forward(grad_grad.contiguous(), indices, ctx.prefix), None, None, None


class GatherTokensFunction(torch.autograd.Function):
    """Autograd wrapper over the gather / scatter-add custom ops."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, indices: torch.Tensor, prefix: int) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.prefix = prefix
        ctx.num_tokens = x.shape[1]
        return torch.ops.sopfast.gather_tokens_forward(x, indices, prefix)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (indices,) = ctx.saved_tensors
        grad_x = GatherTokensBackwardFunction.apply(grad.contiguous(), indices, ctx.prefix, ctx.num_tokens)
        return grad_x, None, None


def _check_index_range(indices: torch.Tensor, num_tokens: int) -> None:
    """Indices in ``[-1, T)``: checked on the host for CPU tensors; on a GPU without a host sync, by a
    device-side assertion (as torch's own indexing does), and the kernels read nothing outside ``x``."""
    check_values(
        ((indices >= -1) & (indices < num_tokens)).all(),
        f"gather_tokens: indices must lie in [0, T={num_tokens}) or be -1 (padding)",
        lambda: f", got values in [{int(indices.min())}, {int(indices.max())}]",
    )


def _check_indices_and_prefix(indices: torch.Tensor, prefix: object, num_tokens: int) -> int:
    """int64/int32 ``indices`` in ``[-1, T)`` and an integer ``prefix`` in ``[0, T]`` (returned)."""
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be int64 or int32, got {indices.dtype}")
    checked: int = check_int("prefix", prefix, 0, num_tokens)
    if indices.numel():
        _check_index_range(indices, num_tokens)
    return checked


def gather_tokens(x: torch.Tensor, indices: torch.Tensor, prefix: int = 0) -> torch.Tensor:
    """Gather each group's tokens.

    Args:
        x: ``[B, T, E]`` token embeddings.
        indices: ``[B, m, k]`` integer token positions in ``[0, T)``, or ``-1`` for padding.
        prefix: number of leading tokens of ``x`` every group keeps (e.g. 1 for CLS).

    Returns:
        ``[B·m, prefix + k, E]`` in ``x``'s dtype.
    """
    check_tensor("x", x)
    check_float("x", x)
    check_rank("x", x, 3, "[B, T, E]")
    check_tensor("indices", indices)
    check_rank("indices", indices, 3, "[B, m, k]")
    check_same_device(x=x, indices=indices)
    if indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices batch {indices.shape[0]} does not match x batch {x.shape[0]}")
    prefix = _check_indices_and_prefix(indices, prefix, x.shape[1])
    return GatherTokensFunction.apply(x.contiguous(), indices.to(torch.int64).contiguous(), int(prefix))
