"""Triton token gather for group execution, ``x [B, T, E]`` → ``[B·m, p + k, E]``, and its backward.

Forward: output row ``b·m + i`` holds the ``p`` prefix tokens ``x[b, :p]`` then
``x[b, indices[b, i, :]]``; index ``-1`` gives a zero row.  Each program copies ``TOKENS`` output
tokens × ``BLOCK_E`` channels.

Backward: a deterministic scatter-add.  The ``B·m·(p + k)`` output slots are sorted by the
token they read (a CSR inverse index built with ``torch.sort`` / ``searchsorted``); each program
then owns one input token × ``BLOCK_E`` channels, sums the gradients of its slots in fp32 in a
fixed order, and writes the result once in the gradient's dtype (tokens nobody read get 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TOKENS_PER_PROGRAM = 8
MAX_BLOCK_E = 256


def _channel_block(e: int) -> int:
    return min(triton.next_power_of_2(e), MAX_BLOCK_E)


@triton.jit
def _gather_tokens_forward_kernel(
    x_ptr,
    indices_ptr,
    out_ptr,
    n_out_tokens,
    t,
    e,
    m,
    k,
    prefix,
    TOKENS: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """``out [B·m·(p+k), E]`` (flattened) from ``x [B·T, E]`` and ``indices [B·m, k]``."""
    slots = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    channels = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    slot_ok = slots < n_out_tokens
    width = prefix + k
    group = slots // width  # = b·m + i
    position = slots % width
    in_body = slot_ok & (position >= prefix)
    body_index = tl.load(indices_ptr + group.to(tl.int64) * k + (position - prefix), mask=in_body, other=-1)
    token = tl.where(position < prefix, position, body_index)
    present = slot_ok & (token >= 0)
    source = ((group // m).to(tl.int64) * t + token) * e
    channel_ok = channels[None, :] < e
    rows = tl.load(x_ptr + source[:, None] + channels[None, :], mask=present[:, None] & channel_ok, other=0)
    tl.store(out_ptr + slots[:, None].to(tl.int64) * e + channels[None, :], rows, mask=slot_ok[:, None] & channel_ok)


@triton.jit
def _gather_tokens_backward_kernel(grad_ptr, slot_order_ptr, slot_start_ptr, out_ptr, e, BLOCK_E: tl.constexpr):
    """``out[token] = Σ grad[slot]`` over the slots that read ``token`` (CSR ``slot_start``/``slot_order``)."""
    token = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    channel_ok = channels < e
    start = tl.load(slot_start_ptr + token)
    end = tl.load(slot_start_ptr + token + 1)
    acc = tl.zeros([BLOCK_E], dtype=tl.float32)
    for j in range(start, end):
        slot = tl.load(slot_order_ptr + j)
        acc += tl.load(grad_ptr + slot * e + channels, mask=channel_ok, other=0).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * e + channels, acc.to(out_ptr.dtype.element_ty), mask=channel_ok)


def _check_indices(indices: torch.Tensor) -> None:
    if indices.dim() != 3 or indices.dtype != torch.int64:
        raise ValueError(f"indices must be int64 [B, m, k], got {indices.dtype} {tuple(indices.shape)}")


def gather_tokens_forward(x: torch.Tensor, indices: torch.Tensor, prefix: int) -> torch.Tensor:
    """``x [B, T, E]``, ``indices [B, m, k]`` (int64, ``-1`` = padding) → ``[B·m, prefix + k, E]``."""
    _check_indices(indices)
    if x.dim() != 3 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"x must be [B, T, E] with B = {indices.shape[0]}, got {tuple(x.shape)}")
    b, t, e = x.shape
    _, m, k = indices.shape
    out = x.new_empty(b * m, prefix + k, e)
    if out.numel() == 0:
        return out
    block_e = _channel_block(e)
    n_out_tokens = b * m * (prefix + k)
    grid = (triton.cdiv(n_out_tokens, TOKENS_PER_PROGRAM), triton.cdiv(e, block_e))
    _gather_tokens_forward_kernel[grid](
        x.contiguous(),
        indices.contiguous(),
        out,
        n_out_tokens,
        t,
        e,
        m,
        k,
        prefix,
        TOKENS=TOKENS_PER_PROGRAM,
        BLOCK_E=block_e,
    )
    return out


def _slots_by_token(indices: torch.Tensor, prefix: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR inverse of the gather: ``slot_order`` lists the output slots (flat ``[B·m·(p+k)]``) grouped
    by the input token (flat ``[B·T]``) they read, ``slot_start [B·T + 1]`` delimits each token's run."""
    b, m, _ = indices.shape
    head = torch.arange(prefix, device=indices.device).expand(b, m, prefix)
    tokens = torch.cat([head, indices], dim=2)
    batch_offset = torch.arange(b, device=indices.device).view(b, 1, 1) * num_tokens
    flat_token = torch.where(tokens >= 0, tokens + batch_offset, b * num_tokens).reshape(-1)  # padding sorts last
    sorted_token, slot_order = torch.sort(flat_token, stable=True)
    bounds = torch.arange(b * num_tokens + 1, device=indices.device)
    return slot_order, torch.searchsorted(sorted_token, bounds)


def gather_tokens_backward(grad: torch.Tensor, indices: torch.Tensor, prefix: int, num_tokens: int) -> torch.Tensor:
    """Scatter-add of ``grad [B·m, prefix + k, E]`` back to ``[B, T = num_tokens, E]`` in ``grad``'s dtype."""
    _check_indices(indices)
    b, m, k = indices.shape
    e = grad.shape[-1]
    if grad.shape != (b * m, prefix + k, e):
        raise ValueError(f"grad must be [B·m, prefix + k, E] = [{b * m}, {prefix + k}, E], got {tuple(grad.shape)}")
    out = grad.new_empty(b, num_tokens, e)
    if out.numel() == 0:
        return out
    slot_order, slot_start = _slots_by_token(indices, prefix, num_tokens)
    block_e = _channel_block(e)
    _gather_tokens_backward_kernel[(b * num_tokens, triton.cdiv(e, block_e))](
        grad.contiguous(), slot_order, slot_start, out, e, BLOCK_E=block_e
    )
    return out
