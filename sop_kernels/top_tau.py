"""Triton top-τ: fused blur → softmax → top-k → mask, indices and λ over logit rows ``[N, d]``.

Forward, per row (``d ≤ 1024``, one row in registers, several rows per program):

1. ``s`` = logits in fp32 (fp64 for fp64), optionally blurred with reflect padding ``ks // 2``
   (2-D separable on the ``(grid_h, grid_w)`` grid — along w, then along h — or 1-D along d);
   the shifted taps are in-register gathers (``tl.gather``);
2. ``a`` = softmax of ``s`` over the valid keys (invalid → 0; ``+inf`` entries share the mass);
3. the group = the ``k`` valid keys with the largest (``largest=False``: smallest) ``s``, ties to
   the lower index: ``s`` is mapped to order-preserving integer keys, the ``k``-th largest key
   is found exactly by a bitwise binary search (one counting pass per key bit), and the ties at
   that key are taken in index order through a cumulative sum;
4. ``λ = 2 Σ_{group} a − 1``; the group's indices are written ascending, ``-1``-padded.

Backward: ``g_j = a_j (∂λ (σ_j − λ) + ∂a_j − Σ_i a_i ∂a_i)`` with ``σ = ±1`` in/out of the
group, then the adjoint (transpose) of the blur, also as in-register gathers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Launch shape, tuned on an H200 (4096 rows of 196 to 1024): one row per program, one warp.
ELEMENTS_PER_PROGRAM = 256  # rows per program = this // BLOCK (at least 1)
ELEMENTS_PER_WARP = 1024


def _compute_dtype(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _launch_shape(n_rows: int, d: int) -> tuple[int, int, int]:
    """``(BLOCK, ROWS, num_warps)``: a power-of-two block covering a row, rows per program, warps."""
    block = triton.next_power_of_2(d)
    rows = max(1, min(ELEMENTS_PER_PROGRAM // block, triton.next_power_of_2(n_rows)))
    return block, rows, min(8, max(1, rows * block // ELEMENTS_PER_WARP))


def _blur_args(blur_kernel: torch.Tensor | None, like: torch.Tensor, grid_h: int, grid_w: int) -> dict:
    """Kernel pointer and the constexprs that select no blur, 1-D blur or 2-D blur."""
    if blur_kernel is None:
        return dict(blur_ptr=like, grid_h=1, grid_w=1, KS=1, HAS_BLUR=False, GRID_2D=False)
    if blur_kernel.dim() != 1 or blur_kernel.numel() % 2 == 0:
        raise ValueError(f"blur_kernel must be 1-D of odd length, got shape {tuple(blur_kernel.shape)}")
    grid_2d = grid_h > 0 and grid_w > 0
    if grid_2d and grid_h * grid_w != like.shape[1]:
        raise ValueError(f"grid ({grid_h}, {grid_w}) does not cover d={like.shape[1]} features")
    sides = (grid_h, grid_w) if grid_2d else (like.shape[1],)
    if blur_kernel.numel() // 2 >= min(sides):
        raise ValueError(f"blur kernel of size {blur_kernel.numel()} is too large for a grid of {sides}")
    return dict(
        blur_ptr=blur_kernel.contiguous(),
        grid_h=grid_h if grid_2d else 1,
        grid_w=grid_w if grid_2d else 1,
        KS=blur_kernel.numel(),
        HAS_BLUR=True,
        GRID_2D=grid_2d,
    )


@triton.jit
def _top_tau_gather_line(x, i, base, stride, size, usable):
    """``x[base + i·stride]`` along each row of ``x [ROWS, BLOCK]`` where ``usable`` and ``0 ≤ i < size``, else 0."""
    ok = usable & (i >= 0) & (i < size)
    source = tl.broadcast_to(tl.where(ok, base + i * stride, 0), x.shape)
    return tl.where(ok, tl.gather(x, source, axis=1), 0.0)


@triton.jit
def _top_tau_blur_axis(x, blur_ptr, pos, base, stride, size, in_row, KS: tl.constexpr):
    """Reflect-padded correlation with ``blur [KS]`` along one grid axis of ``x [ROWS, BLOCK]``:
    lane ``j`` sits at position ``pos[j]`` of a line of ``size`` lanes ``base[j] + q·stride``."""
    out = tl.zeros_like(x)
    for t in tl.static_range(KS):
        q = tl.abs(pos + (t - KS // 2))
        q = tl.where(q >= size, 2 * (size - 1) - q, q)
        out += tl.load(blur_ptr + t).to(x.dtype) * _top_tau_gather_line(x, q, base, stride, size, in_row)
    return out


@triton.jit
def _top_tau_blur_axis_adjoint(g, blur_ptr, pos, base, stride, size, in_row, KS: tl.constexpr):
    """Transpose of :func:`_top_tau_blur_axis`: lane ``pos`` collects ``blur[t]·g[i]`` from every
    output ``i`` whose tap ``t`` read it, directly or through the reflection at either end."""
    out = tl.zeros_like(g)
    for t in tl.static_range(KS):
        shift = KS // 2 - t
        direct = _top_tau_gather_line(g, pos + shift, base, stride, size, in_row)
        low_mirror = _top_tau_gather_line(g, shift - pos, base, stride, size, in_row & (pos >= 1))
        high_mirror = _top_tau_gather_line(
            g, 2 * (size - 1) - pos + shift, base, stride, size, in_row & (pos <= size - 2)
        )
        out += tl.load(blur_ptr + t).to(g.dtype) * (direct + low_mirror + high_mirror)
    return out


@triton.jit
def _top_tau_blur(s, blur_ptr, lanes, d, grid_w, grid_h, KS: tl.constexpr, GRID_2D: tl.constexpr):
    """Blur rows ``s [ROWS, BLOCK]``: along w then h on the grid, or along d."""
    in_row = lanes < d
    if GRID_2D:
        col = lanes % grid_w
        s = _top_tau_blur_axis(s, blur_ptr, col, lanes - col, 1, grid_w, in_row, KS)
        s = _top_tau_blur_axis(s, blur_ptr, lanes // grid_w, col, grid_w, grid_h, in_row, KS)
    else:
        s = _top_tau_blur_axis(s, blur_ptr, lanes, 0, 1, d, in_row, KS)
    return s


@triton.jit
def _top_tau_blur_adjoint(g, blur_ptr, lanes, d, grid_w, grid_h, KS: tl.constexpr, GRID_2D: tl.constexpr):
    """Adjoint of :func:`_top_tau_blur` on ``g [ROWS, BLOCK]``: along h first, then along w."""
    in_row = lanes < d
    if GRID_2D:
        col = lanes % grid_w
        g = _top_tau_blur_axis_adjoint(g, blur_ptr, lanes // grid_w, col, grid_w, grid_h, in_row, KS)
        g = _top_tau_blur_axis_adjoint(g, blur_ptr, col, lanes - col, 1, grid_w, in_row, KS)
    else:
        g = _top_tau_blur_axis_adjoint(g, blur_ptr, lanes, 0, 1, d, in_row, KS)
    return g


@triton.jit
def _top_tau_order_key(s, LARGEST: tl.constexpr, KEY: tl.constexpr, KEY_BITS: tl.constexpr):
    """Signed integer keys ordered like ``s`` (reversed when not ``LARGEST``); ``-0.0`` ties ``+0.0``."""
    bits = tl.where(s == 0, 0.0, s).to(KEY, bitcast=True)
    magnitude = (1 << (KEY_BITS - 1)) - 1
    key = bits ^ ((bits >> (KEY_BITS - 1)) & magnitude)  # negatives: flip the magnitude bits
    if not LARGEST:
        key = ~key
    return key


@triton.jit
def _top_tau_kth_largest_key(key, eligible, k, KEY: tl.constexpr, KEY_BITS: tl.constexpr):
    """Per row, the ``k``-th largest eligible key of ``key [ROWS, BLOCK]``: the largest ``T`` with
    ``#{eligible, key ≥ T} ≥ k``, decided sign first, then bit by bit from the top."""
    non_negative = tl.sum((eligible & (key >= 0)).to(tl.int32), axis=1) >= k
    kth = tl.where(non_negative, 0, -(1 << (KEY_BITS - 1))).to(KEY)
    bit = tl.full([], 1, KEY) << (KEY_BITS - 2)
    for _ in range(KEY_BITS - 1):
        candidate = kth | bit
        count = tl.sum((eligible & (key >= candidate[:, None])).to(tl.int32), axis=1)
        kth = tl.where(count >= k, candidate, kth)
        bit = bit >> 1
    return kth


@triton.jit
def _top_tau_select(s, eligible, k, LARGEST: tl.constexpr, KEY: tl.constexpr, KEY_BITS: tl.constexpr):
    """The ``k [ROWS]`` eligible lanes of ``s [ROWS, BLOCK]`` ranked first, ties to the lower index."""
    key = _top_tau_order_key(s, LARGEST, KEY, KEY_BITS)
    kth = _top_tau_kth_largest_key(key, eligible, k, KEY, KEY_BITS)
    above = eligible & (key > kth[:, None])
    tied = eligible & (key == kth[:, None])
    ties_needed = k - tl.sum(above.to(tl.int32), axis=1)
    return above | (tied & (tl.cumsum(tied.to(tl.int32), axis=1) <= ties_needed[:, None]))


@triton.jit
def _top_tau_softmax(s, eligible):
    """Softmax of ``s [ROWS, BLOCK]`` over eligible lanes (others 0); ``+inf`` lanes share the mass."""
    s = tl.where(eligible, s, float("-inf"))
    posinf = s == float("inf")
    n_posinf = tl.sum(posinf.to(s.dtype), axis=1)
    e = tl.exp(s - tl.max(s, axis=1)[:, None])
    a = e / tl.sum(e, axis=1)[:, None]
    uniform = posinf.to(s.dtype) / tl.maximum(n_posinf, 1.0)[:, None]
    return tl.where(n_posinf[:, None] > 0, uniform, a)


@triton.jit
def _top_tau_forward_kernel(
    logits_ptr,
    k_ptr,
    valid_ptr,
    blur_ptr,
    indices_ptr,
    mask_ptr,
    lam_ptr,
    attention_ptr,
    n_rows,
    d,
    k_max,
    grid_h,
    grid_w,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    COMPUTE: tl.constexpr,
    KEY: tl.constexpr,
    KEY_BITS: tl.constexpr,
    LARGEST: tl.constexpr,
    HAS_VALID: tl.constexpr,
    HAS_BLUR: tl.constexpr,
    GRID_2D: tl.constexpr,
    KS: tl.constexpr,
):
    """Top-τ forward for ``ROWS`` rows of ``logits [N, d]`` per program (see the module docstring)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, BLOCK)[None, :]
    row_ok = rows < n_rows
    in_bounds = row_ok[:, None] & (lanes < d)
    offsets = rows[:, None].to(tl.int64) * d + lanes
    s = tl.load(logits_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)
    if HAS_BLUR:
        s = _top_tau_blur(s, blur_ptr, lanes, d, grid_w, grid_h, KS, GRID_2D)
    eligible = in_bounds
    if HAS_VALID:
        eligible = eligible & (tl.load(valid_ptr + offsets, mask=in_bounds, other=0) != 0)
    k = tl.load(k_ptr + rows, mask=row_ok, other=0).to(tl.int32)

    a = _top_tau_softmax(s, eligible)
    selected = _top_tau_select(s, eligible, k, LARGEST, KEY, KEY_BITS)
    lam = 2.0 * tl.sum(tl.where(selected, a, 0.0), axis=1) - 1.0
    tl.store(attention_ptr + offsets, a, mask=in_bounds)
    tl.store(mask_ptr + offsets, selected, mask=in_bounds)
    tl.store(lam_ptr + rows, lam, mask=row_ok)

    n_selected = tl.sum(selected.to(tl.int32), axis=1)
    slot = tl.cumsum(selected.to(tl.int32), axis=1) - 1
    index_row = indices_ptr + rows[:, None].to(tl.int64) * k_max
    feature = tl.broadcast_to(lanes, selected.shape).to(tl.int64)
    tl.store(index_row + slot, feature, mask=selected & (slot < k_max))
    padding = row_ok[:, None] & (lanes >= n_selected[:, None]) & (lanes < k_max)
    tl.store(index_row + lanes, tl.full(selected.shape, -1, tl.int64), mask=padding)


@triton.jit
def _top_tau_backward_kernel(
    attention_ptr,
    mask_ptr,
    lam_ptr,
    grad_lam_ptr,
    grad_attention_ptr,
    blur_ptr,
    out_ptr,
    n_rows,
    d,
    grid_h,
    grid_w,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    COMPUTE: tl.constexpr,
    HAS_GRAD_ATTENTION: tl.constexpr,
    HAS_BLUR: tl.constexpr,
    GRID_2D: tl.constexpr,
    KS: tl.constexpr,
):
    """Gradient w.r.t. the un-blurred logits for ``ROWS`` rows per program (see the module docstring)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, BLOCK)[None, :]
    row_ok = rows < n_rows
    in_bounds = row_ok[:, None] & (lanes < d)
    offsets = rows[:, None].to(tl.int64) * d + lanes
    a = tl.load(attention_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)
    in_group = tl.load(mask_ptr + offsets, mask=in_bounds, other=0) != 0
    lam = tl.load(lam_ptr + rows, mask=row_ok, other=0).to(COMPUTE)
    grad_lam = tl.load(grad_lam_ptr + rows, mask=row_ok, other=0).to(COMPUTE)

    sign = tl.where(in_group, 1.0, -1.0).to(COMPUTE)
    g = a * (grad_lam[:, None] * (sign - lam[:, None]))
    if HAS_GRAD_ATTENTION:
        ga = tl.load(grad_attention_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)
        g += a * (ga - tl.sum(a * ga, axis=1)[:, None])
    if HAS_BLUR:
        g = _top_tau_blur_adjoint(g, blur_ptr, lanes, d, grid_w, grid_h, KS, GRID_2D)
    tl.store(out_ptr + offsets, g, mask=in_bounds)


def top_tau_forward(
    logits: torch.Tensor,
    k: torch.Tensor,
    k_max: int,
    valid: torch.Tensor | None,
    largest: bool,
    ties_authors: bool,
    blur_kernel: torch.Tensor | None,
    grid_h: int,
    grid_w: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-τ of ``logits [N, d]`` keeping ``k [N]`` (int64) features per row.

    Returns ``indices [N, k_max]`` int64 ascending (``-1`` after a row's ``k``), ``mask [N, d]``
    bool, ``lam [N]`` and ``attention [N, d]`` (fp32; fp64 for fp64 logits).
    """
    if ties_authors:
        raise NotImplementedError("ties_authors=True is not implemented by the Triton kernel yet")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [N, d], got shape {tuple(logits.shape)}")
    n_rows, d = logits.shape
    if not 0 <= k_max <= d:
        raise ValueError(f"k_max must lie in [0, d={d}], got {k_max}")
    if k.shape != (n_rows,):
        raise ValueError(f"k must have shape ({n_rows},), got {tuple(k.shape)}")
    if valid is not None and (valid.shape != logits.shape or valid.dtype != torch.bool):
        raise ValueError(f"valid must be bool {tuple(logits.shape)}, got {valid.dtype} {tuple(valid.shape)}")
    logits = logits.contiguous()
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    indices = logits.new_empty(n_rows, k_max, dtype=torch.int64)
    mask = logits.new_empty(n_rows, d, dtype=torch.bool)
    lam = logits.new_empty(n_rows, dtype=compute)
    attention = logits.new_empty(n_rows, d, dtype=compute)
    if n_rows == 0 or d == 0:
        return indices, mask, lam, attention
    block, rows, num_warps = _launch_shape(n_rows, d)
    key, key_bits = (tl.int64, 64) if compute == torch.float64 else (tl.int32, 32)
    _top_tau_forward_kernel[(triton.cdiv(n_rows, rows),)](
        logits_ptr=logits,
        k_ptr=k.contiguous(),
        valid_ptr=logits if valid is None else valid.contiguous(),
        indices_ptr=indices,
        mask_ptr=mask,
        lam_ptr=lam,
        attention_ptr=attention,
        n_rows=n_rows,
        d=d,
        k_max=k_max,
        ROWS=rows,
        BLOCK=block,
        COMPUTE=_compute_dtype(logits.dtype),
        KEY=key,
        KEY_BITS=key_bits,
        LARGEST=bool(largest),
        HAS_VALID=valid is not None,
        **_blur_args(blur_kernel, logits, grid_h, grid_w),
        num_warps=num_warps,
    )
    return indices, mask, lam, attention


def top_tau_backward(
    attention: torch.Tensor,
    mask: torch.Tensor,
    lam: torch.Tensor,
    grad_lam: torch.Tensor,
    grad_attention: torch.Tensor | None,
    blur_kernel: torch.Tensor | None,
    grid_h: int,
    grid_w: int,
) -> torch.Tensor:
    """Gradient ``[N, d]`` (``attention``'s dtype) w.r.t. the un-blurred logits of :func:`top_tau_forward`,
    given ``∂lam [N]`` and optionally ``∂attention [N, d]``."""
    if attention.dim() != 2 or mask.shape != attention.shape:
        raise ValueError(f"attention and mask must be [N, d], got {tuple(attention.shape)} and {tuple(mask.shape)}")
    n_rows, d = attention.shape
    out = torch.empty_like(attention)
    if out.numel() == 0:
        return out
    block, rows, num_warps = _launch_shape(n_rows, d)
    has_grad_attention = grad_attention is not None
    _top_tau_backward_kernel[(triton.cdiv(n_rows, rows),)](
        attention_ptr=attention.contiguous(),
        mask_ptr=mask.contiguous(),
        lam_ptr=lam.contiguous(),
        grad_lam_ptr=grad_lam.contiguous(),
        grad_attention_ptr=grad_attention.contiguous() if has_grad_attention else attention,
        out_ptr=out,
        n_rows=n_rows,
        d=d,
        ROWS=rows,
        BLOCK=block,
        COMPUTE=_compute_dtype(attention.dtype),
        HAS_GRAD_ATTENTION=has_grad_attention,
        **_blur_args(blur_kernel, attention, grid_h, grid_w),
        num_warps=num_warps,
    )
    return out
