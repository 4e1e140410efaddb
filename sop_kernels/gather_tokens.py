"""Triton token gather for group execution, ``x [B, T, E]`` → ``[B·m, p + k, E]``, and its backward.

Output slot ``s`` of row ``b·m + i`` reads token ``s`` of ``x[b]`` when ``s < p`` (the always-kept
prefix), else token ``indices[b, i, s − p]``; index ``-1`` is padding (a zero row), and so is any
index outside ``[0, T)`` (nothing outside ``x`` is read; the op checks the range).  Slot and row
offsets are int64, so outputs of ``B·m·(p+k) ≥ 2³¹`` rows are addressed correctly.  Each program
handles ``TOKENS`` slots × ``BLOCK_E`` channels, in both directions:

* forward: ``out[slot] = x[source(slot)]``;
* backward: ``acc[source(slot)] += grad[slot]`` with ``tl.atomic_add`` into an fp32 buffer
  ``[B, T, E]`` (fp64 for fp64 gradients; cast to the gradient's dtype at the end).  Float atomics make the summation
  order, hence the last bits, vary from run to run on a GPU (like ``torch.Tensor.scatter_add_``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import on_device

# Launch shape, tuned on an H200 (B=64, T=197, E=768, m=20, k=39): the forward runs at ~70 % of its bandwidth.
TOKENS_PER_PROGRAM = 4
MAX_BLOCK_E = 1024
NUM_WARPS = 4


@triton.jit
def _gather_tokens_slots(program, TOKENS: tl.constexpr):
    """The ``TOKENS`` output slots (int64) of program ``program``."""
    return program.to(tl.int64) * TOKENS + tl.arange(0, TOKENS)


@triton.jit
def _gather_tokens_source(indices_ptr, slots, n_slots, t, m, k, prefix):
    """Row offset in ``x [B·T, E]`` read by each output slot ``[TOKENS]`` (int64), and whether it reads one."""
    width = prefix + k
    group = slots // width  # = b·m + i
    position = slots % width
    slot_ok = slots < n_slots
    in_body = slot_ok & (position >= prefix)
    body_token = tl.load(indices_ptr + group * k + (position - prefix), mask=in_body, other=-1)
    token = tl.where(position < prefix, position, body_token)
    return (group // m) * t + token, slot_ok & (token >= 0) & (token < t)


@triton.jit
def _gather_tokens_forward_kernel(
    x_ptr, indices_ptr, out_ptr, n_slots, t, e, m, k, prefix, TOKENS: tl.constexpr, BLOCK_E: tl.constexpr
):
    """``out [B·m·(p+k), E]`` (flattened) ``= x [B·T, E]`` at each slot's source row (0 for padding)."""
    slots = _gather_tokens_slots(tl.program_id(0), TOKENS)
    channels = (tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E))[None, :]
    source, present = _gather_tokens_source(indices_ptr, slots, n_slots, t, m, k, prefix)
    channel_ok = channels < e
    rows = tl.load(x_ptr + source[:, None] * e + channels, mask=present[:, None] & channel_ok, other=0)
    out_mask = (slots < n_slots)[:, None] & channel_ok
    tl.store(out_ptr + slots[:, None] * e + channels, rows, mask=out_mask)


@triton.jit
def _gather_tokens_backward_kernel(
    grad_ptr, indices_ptr, acc_ptr, n_slots, t, e, m, k, prefix, TOKENS: tl.constexpr, BLOCK_E: tl.constexpr
):
    """``acc [B·T, E]`` (fp32 or fp64, zeroed) ``+= grad [B·m·(p+k), E]`` at each slot's source row."""
    slots = _gather_tokens_slots(tl.program_id(0), TOKENS)
    channels = (tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E))[None, :]
    source, present = _gather_tokens_source(indices_ptr, slots, n_slots, t, m, k, prefix)
    mask = present[:, None] & (channels < e)
    rows = tl.load(grad_ptr + slots[:, None] * e + channels, mask=mask, other=0).to(acc_ptr.dtype.element_ty)
    tl.atomic_add(acc_ptr + source[:, None] * e + channels, rows, mask=mask, sem="relaxed")


def _check_indices(indices: torch.Tensor) -> None:
    if indices.dim() != 3 or indices.dtype != torch.int64:
        raise ValueError(f"indices must be int64 [B, m, k], got {indices.dtype} {tuple(indices.shape)}")


def _launch(kernel, source: torch.Tensor, indices: torch.Tensor, target: torch.Tensor, prefix: int, t: int) -> None:
    """Run ``kernel`` over every output slot of the gather described by ``indices [B, m, k]``."""
    b, m, k = indices.shape
    e = source.shape[-1]
    n_slots = b * m * (prefix + k)
    block_e = min(triton.next_power_of_2(e), MAX_BLOCK_E)
    grid = (triton.cdiv(n_slots, TOKENS_PER_PROGRAM), triton.cdiv(e, block_e))
    with on_device(source):
        kernel[grid](
            source,
            indices.contiguous(),
            target,
            n_slots,
            t,
            e,
            m,
            k,
            prefix,
            TOKENS=TOKENS_PER_PROGRAM,
            BLOCK_E=block_e,
            num_warps=NUM_WARPS,
        )


def gather_tokens_forward(x: torch.Tensor, indices: torch.Tensor, prefix: int) -> torch.Tensor:
    """``x [B, T, E]``, ``indices [B, m, k]`` (int64, ``-1`` = padding) → ``[B·m, prefix + k, E]``."""
    _check_indices(indices)
    if x.dim() != 3 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"x must be [B, T, E] with B = {indices.shape[0]}, got {tuple(x.shape)}")
    b, t, e = x.shape
    _, m, k = indices.shape
    out = x.new_empty(b * m, prefix + k, e)
    if out.numel():
        _launch(_gather_tokens_forward_kernel, x.contiguous(), indices, out, prefix, t)
    return out


def gather_tokens_backward(grad: torch.Tensor, indices: torch.Tensor, prefix: int, num_tokens: int) -> torch.Tensor:
    """Scatter-add of ``grad [B·m, prefix + k, E]`` back to ``[B, T = num_tokens, E]`` in ``grad``'s dtype."""
    _check_indices(indices)
    b, m, k = indices.shape
    e = grad.shape[-1]
    if grad.shape != (b * m, prefix + k, e):
        raise ValueError(f"grad must be [B·m, prefix + k, E] = [{b * m}, {prefix + k}, E], got {tuple(grad.shape)}")
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    acc = torch.zeros(b, num_tokens, e, dtype=acc_dtype, device=grad.device)
    if grad.numel():
        _launch(_gather_tokens_backward_kernel, grad.contiguous(), indices, acc, prefix, num_tokens)
    return acc.to(grad.dtype)
