"""Triton top-τ: fused blur → softmax → top-k → mask, indices and λ over logit rows ``[N, d]``.

Forward, rows of up to ``MAX_BLOCK`` features: **one warp per row** (``ROWS_PER_PROGRAM`` rows and as
many warps per program), the row held as ``[A, ROWS, LANES, VEC]``: lane ``l`` holds the ``VEC``
consecutive features ``(a·LANES + l)·VEC + c`` (16-byte loads of fp32 rows whose length ``VEC``
divides), so every reduction over a row stays inside its warp.  Per row:

1. ``s`` = logits in fp32 (fp64 for fp64), optionally blurred with reflect padding ``ks // 2``
   (2-D separable on the ``(grid_h, grid_w)`` grid — along w, then along h — or 1-D along d);
   the shifted taps are in-register gathers (``tl.gather``) on the row viewed as ``[ROWS, BLOCK]``,
   for rows of up to ``MAX_GATHER_BLOCK`` features.  Longer rows are blurred by torch ops before
   the kernel: ``tl.gather`` is lowered warp-local, thousands of shuffles per thread at BLOCK ≥ 1024;
2. ``a`` = softmax of ``s`` over the valid keys (invalid → 0; ``+inf`` entries share the mass).
   The exp keeps subnormal results as torch's softmax does (:func:`_softmax_exp`, the polynomial of
   ``csrc/top_tau_row.h``; ``tl.exp`` flushes them);
3. the group = the ``k`` valid keys ranked first.  The score is ``s`` (``ties="logits"``: ties to
   the lower index) or :func:`_authors_score` (``ties="authors"``: ``s``, ``−inf`` where the attention
   underflows for sure; ties to the higher index when ``largest``, the lower otherwise) — never the
   rounded attention, so the groups are the other backends' bit for bit.  A launch that blurs in the
   kernel is compiled without fused multiply-adds (``enable_fp_fusion=False``): the taps round as in
   the other backends.  Scores map to order-preserving unsigned keys (every NaN the largest, as
   ``torch.sort``); the ``k``-th largest key is found by a radix search from the top bit,
   ``RADIX_BITS`` bits per reduction (the counts of the ``2^RADIX_BITS − 1`` candidates packed in one
   integer, :func:`_radix_counts`), stopping as soon as every row of the program has
   ``#{key ≥ T} = k``; the ties at that key, when some must be left out, are taken in index order
   through a prefix count within the warp;
4. ``λ = 2 Σ_{group} a − 1``; the group's indices are written ascending (int64, or int32 when
   asked), ``-1``-padded; the attention only when asked.

**Rows without a result** (``sopfast.ops.counts.rows_without_result``: a NaN among the valid logits, or
none above ``−inf``; with a blur any NaN or infinity in the row) keep no feature: indices ``-1``, mask
False, NaN ``λ`` and attention — applied in the kernels.

Rows longer than ``MAX_BLOCK`` run :func:`_top_tau_tiled_kernel`, one row per program, ``TILE``
features at a time (the same radix search, one pass over the row per ``RADIX_BITS`` bits).

Backward: ``g_j = a_j (∂λ (σ_j − λ) + ∂a_j − Σ_i a_i ∂a_i)`` with ``σ = ±1`` in/out of the
group, then the adjoint (transpose) of the blur, also as in-register gathers up to
``MAX_GATHER_BLOCK`` (torch ops after the kernel above it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ._launch import on_device

# Forward launch shape (a speed knob, not yet timed on a GPU): rows per program, one
# warp each.  Rows of up to MAX_BLOCK features are held in registers (at most MAX_BLOCK // 32 values
# per thread); longer ones are processed TILE at a time.
ROWS_PER_PROGRAM = 1
LANES = 32
MAX_BLOCK = 1024
TILE = 1024
# Bits decided per counting reduction of the threshold search (a speed knob): the counts of the
# 2^RADIX_BITS - 1 candidate thresholds are packed in one integer; fewer when they do not fit in 63 bits.
RADIX_BITS = 2
# The blur runs in the kernel (in-register gathers) up to this block, as torch ops around it above.
MAX_GATHER_BLOCK = 512
# Backward launch shape: rows per program = ELEMENTS_PER_PROGRAM // BLOCK (at least 1), one warp per
# ELEMENTS_PER_WARP elements (1 to 8).
ELEMENTS_PER_PROGRAM = 1024
ELEMENTS_PER_WARP = 256


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _key_args(compute: torch.dtype) -> dict:
    """The unsigned key type (and its width) of the compute dtype."""
    if compute == torch.float64:
        return dict(COMPUTE=tl.float64, KEY=tl.uint64, KEY_BITS=64)
    return dict(COMPUTE=tl.float32, KEY=tl.uint32, KEY_BITS=32)


def radix_args(d: int, radix_bits: int | None = None) -> dict:
    """The constexprs of the radix search over rows of ``d``: bits per reduction (``RADIX_BITS`` or
    fewer, so that ``2^bits − 1`` counts of ``W = bit_length(d)`` bits fit in 63), the field width,
    the packed integer type and the pattern of one count in every field."""
    width = max(1, d.bit_length())
    bits = max(1, min(RADIX_BITS if radix_bits is None else radix_bits, (63 // width + 1).bit_length() - 1))
    fields = (1 << bits) - 1
    ones = sum(1 << (width * i) for i in range(fields))
    return dict(RADIX=bits, FIELD=width, PACK=tl.int32 if width * fields <= 31 else tl.int64, ONES=ones)


def _vector_width(d: int, element_size: int) -> int:
    """Features per lane load: the most (16 bytes at most, up to 4) that divide ``d`` and fill a warp."""
    block = triton.next_power_of_2(d)
    for vec in (4, 2):
        if vec * element_size <= 16 and d % vec == 0 and LANES * vec <= block:
            return vec
    return 1


def _forward_shape(n_rows: int, d: int, element_size: int) -> dict:
    """``A``, ``ROWS``, ``VEC`` and ``num_warps`` of :func:`_top_tau_rows_kernel`."""
    vec = _vector_width(d, element_size)
    rows = max(1, min(ROWS_PER_PROGRAM, triton.next_power_of_2(n_rows)))
    return dict(A=max(1, triton.next_power_of_2(d) // (LANES * vec)), ROWS=rows, VEC=vec, num_warps=rows)


def _launch_shape(n_rows: int, d: int) -> tuple[int, int, int]:
    """``(BLOCK, ROWS, num_warps)`` of the backward: a power-of-two block covering a row, rows per
    program, warps."""
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


def _torch_grid(grid_h: int, grid_w: int) -> tuple[int, int] | None:
    return (grid_h, grid_w) if grid_h > 0 and grid_w > 0 else None


def _blur_in_kernel(blur_kernel: torch.Tensor | None, d: int) -> bool:
    """Whether the register kernel blurs (in-register gathers) rather than torch ops around it."""
    return blur_kernel is not None and d <= MAX_BLOCK and triton.next_power_of_2(d) <= MAX_GATHER_BLOCK


#: The blur as torch ops, for rows too long to blur in registers: ``forward(rows [N, d], kernel [ks], grid)``
#: and its ``adjoint``, given by sopfast (its reference, ``sopfast.ops.blur``) when it loads these kernels
#: (``sopfast.ops._backends.triton_kernels``): sop_kernels imports nothing of sopfast, which sits above it.
_TORCH_BLUR: dict[str, Callable[..., torch.Tensor]] = {}


def use_torch_blur(forward: Callable[..., torch.Tensor], adjoint: Callable[..., torch.Tensor]) -> None:
    """Blur rows above :data:`MAX_GATHER_BLOCK` features with ``forward`` (and the gradient with ``adjoint``)."""
    _TORCH_BLUR.update(forward=forward, adjoint=adjoint)


def _torch_blur(rows: torch.Tensor, blur_kernel: torch.Tensor, grid_h: int, grid_w: int, adjoint: bool) -> torch.Tensor:
    """The blur of ``rows [N, d]`` (or its adjoint) as torch ops, in ``rows``' dtype (:func:`use_torch_blur`)."""
    blur = _TORCH_BLUR.get("adjoint" if adjoint else "forward")
    if blur is None:
        raise RuntimeError(
            f"sop_kernels.top_tau blurs rows of more than {MAX_GATHER_BLOCK} features with sopfast's torch blur, "
            "which sopfast hands over when it loads these kernels: call sopfast.ops._backends.triton_kernels() first"
        )
    return blur(rows, blur_kernel.to(rows.dtype), _torch_grid(grid_h, grid_w))


# ----------------------------------------------------------------------------- blur


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


# ----------------------------------------------------------------------------- softmax and keys


@triton.jit
def _softmax_exp(x):
    """``exp(x)`` for the softmax's ``x ≤ 0`` keeping subnormal results (torch's softmax keeps them:
    ``softmax([0, -90]) = [1, 8.19e-40]``): ``x = n ln2 + r``, Cephes' polynomial for ``e^r``, ``2^n``
    from exponent bits, applied in two steps below ``2^-126`` so the result is rounded once into the
    subnormal grid; 0 below -104.  The polynomial of ``csrc/top_tau_row.h``.  fp64: ``tl.exp``."""
    if x.dtype == tl.float64:
        return tl.exp(x)
    c = tl.maximum(x, -104.0)
    n = -tl.floor(0.5 - c * 1.44269504088896341)
    r = (c - n * 0.693359375) - n * -2.12194440e-4
    p = r * 1.9875691500e-4 + 1.3981999507e-3
    p = p * r + 8.3334519073e-3
    p = p * r + 4.1665795894e-2
    p = p * r + 1.6666665459e-1
    p = p * r + 5.0000001201e-1
    p = p * r * r + r + 1.0
    ni = n.to(tl.int32)
    subnormal = ni < -126
    scale = ((tl.where(subnormal, ni + 64, ni) + 127) << 23).to(tl.float32, bitcast=True)
    post = tl.where(subnormal, 5.42101086242752217e-20, 1.0)
    return tl.where(x > -104.0, (p * scale) * post, 0.0)


@triton.jit
def _authors_score(s, row_max):
    """The score of ``ties="authors"`` (``sopfast.ops.top_tau.authors_scores``): ``s``, or ``−inf`` where
    ``s − row_max`` is at most the largest value whose exp rounds to 0 (``SOFTMAX_ZERO_AT``)."""
    if s.dtype == tl.float64:  # a float literal is fp32 in Triton: the fp64 cut as an fp64 constant
        zero = s - row_max <= tl.full([], -745.1332191019412, tl.float64)
    else:
        zero = s - row_max <= -103.97208404541016
    return tl.where(zero, float("-inf"), s)


@triton.jit
def _top_tau_order_key(score, LARGEST: tl.constexpr, KEY: tl.constexpr, KEY_BITS: tl.constexpr):
    """Unsigned keys ordered like ``score`` as ``torch.sort`` orders it (reversed when not
    ``LARGEST``): ``-0.0`` ties ``+0.0`` and every NaN — whatever its sign bit (x86 makes ``inf − inf``
    with the sign set) — is the largest value."""
    score = tl.where(score != score, float("nan"), tl.where(score == 0, 0.0, score))
    bits = score.to(KEY, bitcast=True)
    top = tl.full([], 1, KEY) << (KEY_BITS - 1)
    every = top | (top - 1)  # (``~`` of an unsigned key fails in Triton's interpreter)
    key = tl.where((bits & top) != 0, bits ^ every, bits | top)  # negatives: flip every bit; others: the sign bit
    if not LARGEST:
        key = key ^ every
    return key


@triton.jit
def _radix_digit(key, kth, shift, RADIX: tl.constexpr, PACK: tl.constexpr, FIELD: tl.constexpr, ONES: tl.constexpr):
    """One key's share of the packed counts of a radix step: field ``i − 1`` counts ``key ≥ kth | i <<
    shift`` for ``i`` in ``[1, 2^bits)`` (``kth`` has no bit set at or below ``shift + bits``)."""
    top = (1 << RADIX) - 1
    key_high = key >> shift
    base = kth >> shift
    digit = tl.where(key_high < base, 0, tl.where(key_high > base + top, top, key_high - base)).to(tl.int32)
    return tl.full([], ONES, PACK) >> (FIELD * (top - digit)).to(PACK)


@triton.jit
def _radix_step(packed, kth, exact, k, shift, RADIX: tl.constexpr, PACK: tl.constexpr, FIELD: tl.constexpr):
    """From the packed counts of a radix step, the next threshold prefix and whether ``#{key ≥ kth}`` is
    now exactly ``k``: the largest digit whose count still reaches ``k``."""
    best = tl.zeros_like(k)
    best_count = tl.zeros_like(k)
    for i in tl.static_range(1, 1 << RADIX):
        count = ((packed >> (FIELD * (i - 1))) & ((1 << FIELD) - 1)).to(tl.int32)
        take = count >= k
        best = tl.where(take, i, best)
        best_count = tl.where(take, count, best_count)
    moved = (best > 0) & ~exact
    kth = tl.where(moved, kth | (best.to(kth.dtype) << shift), kth)
    return kth, exact | (moved & (best_count == k))


# ----------------------------------------------------------------------------- the row kernel


@triton.jit
def _row_sum(x):
    """Sums over each row of ``x [A, ROWS, LANES, VEC]``: ``[1, ROWS, 1, 1]``."""
    return tl.sum(tl.sum(tl.sum(x, axis=3, keep_dims=True), axis=2, keep_dims=True), axis=0, keep_dims=True)


@triton.jit
def _row_max(x):
    return tl.max(tl.max(tl.max(x, axis=3, keep_dims=True), axis=2, keep_dims=True), axis=0, keep_dims=True)


@triton.jit
def _row_prefix(x):
    """Inclusive prefix sums of ``x [A, ROWS, LANES, VEC]`` in feature order ``(a·LANES + l)·VEC + c``:
    within the thread, then one scan of each row's ``A·LANES`` lane sums.  (A scan along the lanes of
    the 4-D tensor does not compile on sm_90 with Triton 3.6: an assertion in its scan lowering.)"""
    A: tl.constexpr = x.shape[0]
    ROWS: tl.constexpr = x.shape[1]
    LANES: tl.constexpr = x.shape[2]
    per_lane = tl.reshape(tl.permute(tl.sum(x, axis=3), (1, 0, 2)), (ROWS, A * LANES))
    before = tl.cumsum(per_lane, axis=1) - per_lane
    before = tl.permute(tl.reshape(before, (ROWS, A, LANES)), (1, 0, 2))
    return tl.expand_dims(before, 3) + tl.cumsum(x, axis=3)


@triton.jit
def _any(flag, ROWS: tl.constexpr):
    """Whether ``flag [1, ROWS, 1, 1]`` holds anywhere (a scalar)."""
    return tl.max(tl.reshape(flag.to(tl.int32), (ROWS,)), axis=0) > 0


@triton.jit
def _as_lines(x, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """``x [A, ROWS, LANES, VEC]`` as ``[ROWS, BLOCK]`` in feature order."""
    return tl.reshape(tl.permute(x, (1, 0, 2, 3)), (ROWS, BLOCK))


@triton.jit
def _from_lines(x, A: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr):
    return tl.permute(tl.reshape(x, (ROWS, A, 32, VEC)), (1, 0, 2, 3))


@triton.jit
def _top_tau_rows_kernel(
    logits_ptr,
    raw_ptr,
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
    A: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
    COMPUTE: tl.constexpr,
    KEY: tl.constexpr,
    KEY_BITS: tl.constexpr,
    RADIX: tl.constexpr,
    FIELD: tl.constexpr,
    PACK: tl.constexpr,
    ONES: tl.constexpr,
    LARGEST: tl.constexpr,
    TIES_AUTHORS: tl.constexpr,
    HIGHER_FIRST: tl.constexpr,
    HAS_K: tl.constexpr,
    HAS_VALID: tl.constexpr,
    HAS_ATTENTION: tl.constexpr,
    HAS_BLUR: tl.constexpr,
    GRID_2D: tl.constexpr,
    KS: tl.constexpr,
    RAW_CHECK: tl.constexpr,
):
    """Top-τ forward of ``ROWS`` rows of ``logits [N, d]`` per program, one warp per row (see the module
    docstring); ``VEC`` divides ``d``.  ``RAW_CHECK``: the logits were blurred by torch ops, and a NaN or
    infinity in the row ``raw [N, d]`` before the blur leaves it without a result."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[None, :, None, None]
    lane_vector = tl.arange(0, A)[:, None, None, None] * 32 + tl.arange(0, 32)[None, None, :, None]
    position = lane_vector * VEC + tl.arange(0, VEC)[None, None, None, :]
    row_ok = row < n_rows
    in_bounds = tl.broadcast_to(row_ok & (lane_vector * VEC < d), (A, ROWS, 32, VEC))
    offsets = tl.multiple_of(row * d + position, [1, 1, 1, VEC])  # rows start at multiples of VEC
    s = tl.load(logits_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)
    eligible = in_bounds
    if HAS_VALID:
        eligible = eligible & (tl.load(valid_ptr + offsets, mask=in_bounds, other=0) != 0)
    if HAS_K:
        k = tl.load(k_ptr + row, mask=row_ok, other=0).to(tl.int32)
    else:
        k = tl.full(row.shape, k_max, tl.int32)

    undefined = tl.zeros(row.shape, tl.int1)
    if HAS_BLUR:
        # a blur mixes every entry with its neighbours: any NaN or infinity leaves the row without a result
        undefined = _row_sum((in_bounds & (s - s != 0)).to(tl.int32)) > 0
        lines = _top_tau_blur(
            _as_lines(s, ROWS, A * 32 * VEC),
            blur_ptr,
            tl.arange(0, A * 32 * VEC)[None, :],
            d,
            grid_w,
            grid_h,
            KS,
            GRID_2D,
        )
        s = _from_lines(lines, A, ROWS, VEC)
    if RAW_CHECK:
        raw = tl.load(raw_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)
        undefined = undefined | (_row_sum((raw - raw != 0).to(tl.int32)) > 0)

    # softmax over the eligible lanes; the three counts in one reduction (each at most d <= 1024)
    s = tl.where(eligible, s, float("-inf"))
    posinf = s == float("inf")
    counts = _row_sum(posinf.to(tl.int32) + ((s != s).to(tl.int32) << 11) + (eligible.to(tl.int32) << 22))
    n_posinf = (counts & 2047).to(COMPUTE)
    n_eligible = counts >> 22
    row_max = _row_max(tl.where(s == s, s, float("-inf")))
    undefined = undefined | (((counts >> 11) & 2047) > 0) | (row_max == float("-inf"))
    e = tl.where(eligible & (s == s), _softmax_exp(s - row_max), 0.0)
    a = e * (1.0 / _row_sum(e))
    a = tl.where(n_posinf > 0, posinf.to(COMPUTE) / tl.maximum(n_posinf, 1.0), a)
    a = tl.where(undefined, float("nan"), a)

    # the threshold: the k-th largest key, RADIX bits per reduction from the top
    if TIES_AUTHORS:
        key = _top_tau_order_key(_authors_score(s, row_max), LARGEST, KEY, KEY_BITS)
    else:
        key = _top_tau_order_key(s, LARGEST, KEY, KEY_BITS)
    kth = tl.zeros(row.shape, KEY)
    exact = n_eligible == k
    position_bits = KEY_BITS
    running = _any(~exact, ROWS)
    while running:  # sass-loop: triton_top_tau_search
        step = tl.minimum(position_bits, RADIX)
        shift = (position_bits - step).to(KEY)
        packed = _row_sum(tl.where(eligible, _radix_digit(key, kth, shift, RADIX, PACK, FIELD, ONES), 0))
        kth, exact = _radix_step(packed, kth, exact, k, shift, RADIX, PACK, FIELD)
        position_bits -= step
        running = (position_bits > 0) & _any(~exact, ROWS)

    selected = eligible & (key >= kth)
    if _any(~exact, ROWS):
        # keep the first `needed` ties at the threshold (from the highest index when HIGHER_FIRST)
        above = eligible & (key > kth)
        tied = (eligible & (key == kth)).to(tl.int32)
        needed = k - _row_sum(above.to(tl.int32))
        through = _row_prefix(tied)
        if HIGHER_FIRST:
            rank = _row_sum(tied) - through + tied
        else:
            rank = through
        selected = above | ((tied != 0) & (rank <= needed))
    selected = selected & ~undefined

    lam = tl.where(undefined, float("nan"), 2.0 * _row_sum(tl.where(selected, a, 0.0)) - 1.0)
    tl.store(lam_ptr + row, lam, mask=row_ok)
    tl.store(mask_ptr + offsets, selected, mask=in_bounds)
    if HAS_ATTENTION:
        tl.store(attention_ptr + offsets, a, mask=in_bounds)
    chosen = selected.to(tl.int32)
    slot = _row_prefix(chosen) - 1
    index_row = indices_ptr + row * k_max
    index_type = indices_ptr.dtype.element_ty
    tl.store(index_row + slot, position.to(index_type), mask=selected & (slot < k_max))
    padding = row_ok & (position >= _row_sum(chosen)) & (position < k_max)
    tl.store(index_row + position, tl.full(position.shape, -1, index_type), mask=padding)


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
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, BLOCK)[None, :]
    row_ok = rows < n_rows
    in_bounds = row_ok[:, None] & (lanes < d)
    offsets = rows[:, None] * d + lanes
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


# ----------------------------------------------------------------------------- tiled kernels (long rows)


@triton.jit
def _tiled_load(s_ptr, valid_ptr, base, j, d, COMPUTE: tl.constexpr, HAS_VALID: tl.constexpr):
    """One tile of a row: the scores ``s`` (``-inf`` outside the row or where invalid) and eligibility."""
    ok = j < d
    if HAS_VALID:
        ok = ok & (tl.load(valid_ptr + base + j, mask=j < d, other=0) != 0)
    s = tl.load(s_ptr + base + j, mask=ok, other=float("-inf")).to(COMPUTE)
    return tl.where(ok, s, float("-inf")), ok


@triton.jit
def _tiled_attention(s, ok, row_max, inv_sum, n_posinf, undefined):
    """The softmax of one tile given the row's statistics (NaN for a row without a result)."""
    a = tl.where(ok & (s == s), _softmax_exp(s - row_max), 0.0) * inv_sum
    uniform = tl.where(s == float("inf"), 1.0 / tl.maximum(n_posinf, 1.0), 0.0)
    a = tl.where(n_posinf > 0, uniform, a)
    return tl.where(undefined, float("nan"), a)


@triton.jit
def _tiled_key(
    s, row_max, LARGEST: tl.constexpr, TIES_AUTHORS: tl.constexpr, KEY: tl.constexpr, KEY_BITS: tl.constexpr
):
    """Keys of one tile: of :func:`_authors_score` (``TIES_AUTHORS``) or of the scores."""
    if TIES_AUTHORS:
        return _top_tau_order_key(_authors_score(s, row_max), LARGEST, KEY, KEY_BITS)
    return _top_tau_order_key(s, LARGEST, KEY, KEY_BITS)


@triton.jit
def _top_tau_tiled_kernel(
    s_ptr,
    raw_ptr,
    k_ptr,
    valid_ptr,
    indices_ptr,
    mask_ptr,
    lam_ptr,
    attention_ptr,
    d,
    k_max,
    TILE: tl.constexpr,
    COMPUTE: tl.constexpr,
    KEY: tl.constexpr,
    KEY_BITS: tl.constexpr,
    RADIX: tl.constexpr,
    FIELD: tl.constexpr,
    PACK: tl.constexpr,
    ONES: tl.constexpr,
    LARGEST: tl.constexpr,
    TIES_AUTHORS: tl.constexpr,
    HIGHER_FIRST: tl.constexpr,
    HAS_K: tl.constexpr,
    HAS_VALID: tl.constexpr,
    HAS_ATTENTION: tl.constexpr,
    RAW_CHECK: tl.constexpr,
):
    """Top-τ forward of one long row per program, ``TILE`` features per pass over ``s [N, d]`` (already
    blurred by torch ops when ``RAW_CHECK``: a NaN or infinity in the row ``raw [N, d]`` before the blur
    leaves it without a result): statistics, the softmax sum, the radix search's counting passes, then
    one pass writing attention, mask, λ and the indices."""
    row = tl.program_id(0).to(tl.int64)
    base = row * d
    lanes = tl.arange(0, TILE)
    if HAS_K:
        k = tl.load(k_ptr + row).to(tl.int32)
    else:
        k = k_max

    row_max = tl.full([], float("-inf"), COMPUTE)
    n_posinf = tl.zeros([], COMPUTE)
    n_nan = tl.zeros([], tl.int32)
    n_eligible = tl.zeros([], tl.int32)
    for start in range(0, d, TILE):
        s, ok = _tiled_load(s_ptr, valid_ptr, base, start + lanes, d, COMPUTE, HAS_VALID)
        row_max = tl.maximum(row_max, tl.max(tl.where(s == s, s, float("-inf")), axis=0))
        n_posinf += tl.sum((s == float("inf")).to(COMPUTE), axis=0)
        n_nan += tl.sum((s != s).to(tl.int32), axis=0)
        n_eligible += tl.sum(ok.to(tl.int32), axis=0)
    undefined = (n_nan > 0) | (row_max == float("-inf"))
    if RAW_CHECK:
        for start in range(0, d, TILE):
            raw = tl.load(raw_ptr + base + start + lanes, mask=start + lanes < d, other=0).to(COMPUTE)
            undefined = undefined | (tl.sum((raw - raw != 0).to(tl.int32), axis=0) > 0)
    total = tl.zeros([], COMPUTE)
    for start in range(0, d, TILE):
        s, ok = _tiled_load(s_ptr, valid_ptr, base, start + lanes, d, COMPUTE, HAS_VALID)
        total += tl.sum(tl.where(ok & (s == s), _softmax_exp(s - row_max), 0.0), axis=0)
    inv_sum = 1.0 / total

    kth = tl.zeros([], KEY)
    exact = n_eligible == k
    position_bits = KEY_BITS
    running = exact == 0
    while running:
        step = tl.minimum(position_bits, RADIX)
        shift = (position_bits - step).to(KEY)
        packed = tl.zeros([], PACK)
        for start in range(0, d, TILE):
            s, ok = _tiled_load(s_ptr, valid_ptr, base, start + lanes, d, COMPUTE, HAS_VALID)
            key = _tiled_key(s, row_max, LARGEST, TIES_AUTHORS, KEY, KEY_BITS)
            packed += tl.sum(tl.where(ok, _radix_digit(key, kth, shift, RADIX, PACK, FIELD, ONES), 0), axis=0)
        kth, exact = _radix_step(packed, kth, exact, k, shift, RADIX, PACK, FIELD)
        position_bits -= step
        running = (position_bits > 0) & (exact == 0)

    above = tl.zeros([], tl.int32)
    n_tied = tl.zeros([], tl.int32)
    for start in range(0, d, TILE):
        s, ok = _tiled_load(s_ptr, valid_ptr, base, start + lanes, d, COMPUTE, HAS_VALID)
        key = _tiled_key(s, row_max, LARGEST, TIES_AUTHORS, KEY, KEY_BITS)
        above += tl.sum((ok & (key > kth)).to(tl.int32), axis=0)
        n_tied += tl.sum((ok & (key == kth)).to(tl.int32), axis=0)
    needed = k - above

    tied_before = tl.zeros([], tl.int32)
    n_selected = tl.zeros([], tl.int32)
    kept = tl.zeros([], COMPUTE)
    index_type = indices_ptr.dtype.element_ty
    for start in range(0, d, TILE):
        j = start + lanes
        s, ok = _tiled_load(s_ptr, valid_ptr, base, j, d, COMPUTE, HAS_VALID)
        a = _tiled_attention(s, ok, row_max, inv_sum, n_posinf, undefined)
        key = _tiled_key(s, row_max, LARGEST, TIES_AUTHORS, KEY, KEY_BITS)
        tied = (ok & (key == kth)).to(tl.int32)
        through = tied_before + tl.cumsum(tied, axis=0)
        if HIGHER_FIRST:
            rank = n_tied - through + tied
        else:
            rank = through
        selected = ((ok & (key > kth)) | ((tied != 0) & (rank <= needed))) & ~undefined
        if HAS_ATTENTION:
            tl.store(attention_ptr + base + j, a, mask=j < d)
        tl.store(mask_ptr + base + j, selected, mask=j < d)
        kept += tl.sum(tl.where(selected, a, 0.0), axis=0)
        slot = n_selected + tl.cumsum(selected.to(tl.int32), axis=0) - 1
        tl.store(indices_ptr + row * k_max + slot, j.to(index_type), mask=selected & (slot < k_max))
        tied_before += tl.sum(tied, axis=0)
        n_selected += tl.sum(selected.to(tl.int32), axis=0)
    tl.store(lam_ptr + row, tl.where(undefined, float("nan"), 2.0 * kept - 1.0))
    for start in range(0, k_max, TILE):
        position = start + lanes
        padding = (position >= n_selected) & (position < k_max)
        tl.store(indices_ptr + row * k_max + position, tl.full([TILE], -1, index_type), mask=padding)


@triton.jit
def _top_tau_tiled_backward_kernel(
    attention_ptr,
    mask_ptr,
    lam_ptr,
    grad_lam_ptr,
    grad_attention_ptr,
    out_ptr,
    d,
    TILE: tl.constexpr,
    COMPUTE: tl.constexpr,
    HAS_GRAD_ATTENTION: tl.constexpr,
):
    """The backward's closed form (before the blur's adjoint) for one long row per program."""
    row = tl.program_id(0).to(tl.int64)
    base = row * d
    lanes = tl.arange(0, TILE)
    lam = tl.load(lam_ptr + row).to(COMPUTE)
    grad_lam = tl.load(grad_lam_ptr + row).to(COMPUTE)
    dot = tl.zeros([], COMPUTE)
    if HAS_GRAD_ATTENTION:
        for start in range(0, d, TILE):
            j = start + lanes
            a = tl.load(attention_ptr + base + j, mask=j < d, other=0).to(COMPUTE)
            dot += tl.sum(a * tl.load(grad_attention_ptr + base + j, mask=j < d, other=0).to(COMPUTE), axis=0)
    for start in range(0, d, TILE):
        j = start + lanes
        a = tl.load(attention_ptr + base + j, mask=j < d, other=0).to(COMPUTE)
        sign = tl.where(tl.load(mask_ptr + base + j, mask=j < d, other=0) != 0, 1.0, -1.0).to(COMPUTE)
        g = a * (grad_lam * (sign - lam))
        if HAS_GRAD_ATTENTION:
            g += a * (tl.load(grad_attention_ptr + base + j, mask=j < d, other=0).to(COMPUTE) - dot)
        tl.store(out_ptr + base + j, g, mask=j < d)


# ----------------------------------------------------------------------------- wrappers


def top_tau_forward(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    k_max: int,
    valid: torch.Tensor | None,
    largest: bool,
    ties_authors: bool,
    blur_kernel: torch.Tensor | None,
    grid_h: int,
    grid_w: int,
    need_attention: bool = True,
    int32_indices: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-τ of ``logits [N, d]`` keeping ``k [N]`` (int64, at most the row's valid count; ``None``:
    ``k_max`` in every row) features.

    ``ties_authors`` ranks :func:`_authors_score` (equal values: higher index first when ``largest``),
    else the blurred logits (equal values: lower index first).  Returns ``indices [N, k_max]`` (int64, int32
    with ``int32_indices``) ascending (``-1`` after a row's ``k``), ``mask [N, d]`` bool, ``lam [N]`` and
    ``attention [N, d]`` (fp32; fp64 for fp64 logits; ``[N, 0]`` without ``need_attention``).  Rows
    without a result keep no feature and get NaN ``lam`` and attention.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [N, d], got shape {tuple(logits.shape)}")
    n_rows, d = logits.shape
    if not 0 <= k_max <= d:
        raise ValueError(f"k_max must lie in [0, d={d}], got {k_max}")
    if k is not None and k.shape != (n_rows,):
        raise ValueError(f"k must have shape ({n_rows},), got {tuple(k.shape)}")
    if valid is not None and (valid.shape != logits.shape or valid.dtype != torch.bool):
        raise ValueError(f"valid must be bool {tuple(logits.shape)}, got {valid.dtype} {tuple(valid.shape)}")
    logits = logits.contiguous()
    compute = _compute_dtype(logits.dtype)
    indices = logits.new_empty(n_rows, k_max, dtype=torch.int32 if int32_indices else torch.int64)
    mask = logits.new_empty(n_rows, d, dtype=torch.bool)
    lam = logits.new_empty(n_rows, dtype=compute)
    attention = logits.new_empty(n_rows, d if need_attention else 0, dtype=compute)
    if n_rows == 0 or d == 0:
        return indices, mask, lam, attention
    rule = dict(LARGEST=bool(largest), TIES_AUTHORS=bool(ties_authors), HIGHER_FIRST=bool(ties_authors and largest))
    common = dict(
        raw_ptr=logits,
        k_ptr=logits if k is None else k.contiguous(),
        valid_ptr=logits if valid is None else valid.contiguous(),
        indices_ptr=indices,
        mask_ptr=mask,
        lam_ptr=lam,
        attention_ptr=attention if need_attention else lam,
        k_max=k_max,
        HAS_K=k is not None,
        HAS_VALID=valid is not None,
        HAS_ATTENTION=bool(need_attention),
        **_key_args(compute),
        **radix_args(d),
        **rule,
    )
    with on_device(logits):
        s = logits
        torch_blur = blur_kernel is not None and not _blur_in_kernel(blur_kernel, d)
        if torch_blur:
            s = _torch_blur(logits.to(compute), blur_kernel, grid_h, grid_w, adjoint=False)
        if d > MAX_BLOCK:
            _top_tau_tiled_kernel[(n_rows,)](s_ptr=s.to(compute), d=d, TILE=TILE, RAW_CHECK=torch_blur, **common)
            return indices, mask, lam, attention
        shape = _forward_shape(n_rows, d, s.element_size())
        blur = _blur_args(None if torch_blur else blur_kernel, s, grid_h, grid_w)
        _top_tau_rows_kernel[(triton.cdiv(n_rows, shape["ROWS"]),)](
            logits_ptr=s,
            n_rows=n_rows,
            d=d,
            RAW_CHECK=torch_blur,
            **blur,
            **shape,
            **common,
            enable_fp_fusion=not blur["HAS_BLUR"],  # the blur's taps rounded one by one, as on every backend
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
    blur = _blur_args(blur_kernel, attention, grid_h, grid_w)
    has_grad_attention = grad_attention is not None
    inputs = dict(
        attention_ptr=attention.contiguous(),
        mask_ptr=mask.contiguous(),
        lam_ptr=lam.contiguous(),
        grad_lam_ptr=grad_lam.contiguous(),
        grad_attention_ptr=grad_attention.contiguous() if has_grad_attention else attention,
        out_ptr=out,
        d=d,
        COMPUTE=_key_args(attention.dtype)["COMPUTE"],
        HAS_GRAD_ATTENTION=has_grad_attention,
    )
    with on_device(attention):
        if d > MAX_BLOCK:
            _top_tau_tiled_backward_kernel[(n_rows,)](TILE=TILE, **inputs)
        else:
            block, rows, num_warps = _launch_shape(n_rows, d)
            in_kernel = blur if _blur_in_kernel(blur_kernel, d) else _blur_args(None, attention, grid_h, grid_w)
            _top_tau_backward_kernel[(triton.cdiv(n_rows, rows),)](
                n_rows=n_rows, ROWS=rows, BLOCK=block, **inputs, **in_kernel, num_warps=num_warps
            )
        if blur_kernel is None or _blur_in_kernel(blur_kernel, d):
            return out
        return _torch_blur(out, blur_kernel, grid_h, grid_w, adjoint=True)
