"""Token gather for group execution: ``[B, T, E]`` → ``[B·m, p + k, E]``.

Row ``b·m + i`` of the output holds the ``p`` always-kept prefix tokens ``x[b, :p]``
(e.g. CLS) followed by the tokens ``x[b, indices[b, i]]``; an index of ``-1`` is padding
and gives a zero row.  Never materialises ``[B, m, T, E]``.  Backward is a scatter-add into
``[B, T, E]`` accumulated in fp32 (fp64 for fp64); being linear in the incoming gradient, its own
backward is the gather again (higher-order gradients work).
"""

from __future__ import annotations

import torch

from ..checks import check_float, check_int, check_rank, check_same_device, check_values
from . import _backends


def gather_tokens_reference(x: torch.Tensor, indices: torch.Tensor, prefix: int = 0) -> torch.Tensor:
    """Pure-PyTorch gather (the oracle): ``x [B, T, E]``, ``indices [B, m, k]`` → ``[B·m, p+k, E]``.

    Checks its arguments as :func:`gather_tokens` does, and the indices' values (integers in ``[-1, T)``:
    an index ``T`` would read the next example's first token)."""
    prefix = _check_arguments(x, indices, prefix)
    b, t, e = x.shape
    if indices.numel():
        _check_index_range(indices, t)
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


# torch.ops.sopfast.gather_tokens / gather_tokens_backward (int64 indices); the references look the
# module's functions up at call time (tests replace them)
_forward = _backends.Op(
    "gather_tokens",
    "(Tensor x, Tensor indices, int prefix) -> Tensor",
    "gather_tokens_forward",
    lambda *args: gather_tokens_reference(*args),
    lambda x, indices, prefix: x.new_empty(indices.shape[0] * indices.shape[1], prefix + indices.shape[2], x.shape[-1]),
).overload
_backends.Op(
    "gather_tokens_backward",
    "(Tensor grad, Tensor indices, int prefix, int num_tokens) -> Tensor",
    "gather_tokens_backward",
    lambda *args: gather_tokens_backward_reference(*args),
    lambda grad, indices, prefix, num_tokens: grad.new_empty(indices.shape[0], num_tokens, grad.shape[-1]),
)


def _check_index_range(indices: torch.Tensor, num_tokens: int) -> None:
    """Indices in ``[-1, T)``: checked on the host for CPU tensors; on a GPU without a host sync, by a
    device-side assertion (as torch's own indexing does), and the kernels read nothing outside ``x``."""
    check_values(
        ((indices >= -1) & (indices < num_tokens)).all(),
        f"gather_tokens: indices must lie in [0, T={num_tokens}) or be -1 (padding)",
        lambda: f", got values in [{int(indices.min())}, {int(indices.max())}]",
    )


def _check_arguments(x: torch.Tensor, indices: torch.Tensor, prefix: object) -> int:
    """A float ``x [B, T, E]``, int64/int32 ``indices [B, m, k]`` on its device and an integer ``prefix`` in
    ``[0, T]`` (returned); the indices' values are the kernels' to check."""
    check_float("x", x)
    check_rank("x", x, 3, "[B, T, E]")
    check_rank("indices", indices, 3, "[B, m, k]")
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be int64 or int32, got {indices.dtype}")
    if indices.device != x.device:
        check_same_device(x=x, indices=indices)
    if indices.shape[0] != x.shape[0]:
        raise ValueError(
            f"indices batch {indices.shape[0]} does not match x batch {x.shape[0]} "
            f"(x {tuple(x.shape)} [B, T, E], indices {tuple(indices.shape)} [B, m, k])"
        )
    if type(prefix) is not int:
        prefix = int(check_int("prefix", prefix))
    if not 0 <= prefix <= x.shape[1]:
        raise ValueError(f"prefix must lie in [0, T={x.shape[1]}], got {prefix}")
    return prefix


def gather_tokens(x: torch.Tensor, indices: torch.Tensor, prefix: int = 0) -> torch.Tensor:
    """Gather each group's tokens (``torch.ops.sopfast.gather_tokens`` after the checks).

    Args:
        x: ``[B, T, E]`` token embeddings.
        indices: ``[B, m, k]`` integer token positions in ``[0, T)``, or ``-1`` for padding.
        prefix: number of leading tokens of ``x`` every group keeps (e.g. 1 for CLS).

    Returns:
        ``[B·m, prefix + k, E]`` in ``x``'s dtype.
    """
    _backends.check_extension()
    prefix = _check_arguments(x, indices, prefix)
    return _forward(x, indices.long(), prefix)  # every kernel checks the indices' values
