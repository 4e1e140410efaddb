"""Triton sparsemax over the rows of ``x [N, n]`` (forward and backward).

Forward: ``p = max(z − τ, 0)`` with ``z = x − max x`` and the simplex threshold ``τ``
(``Σ max(z − τ, 0) = 1``), found without sorting: a few bisection steps on ``[−1, 0]`` bracket
``τ`` from below, then Michelot steps ``τ ← max(τ, (Σ_{z > τ} z − 1) / |{z > τ}|)``, which from a
lower bound only shrink the support (the ``max`` keeps rounding from undoing a step), run until it
stops shrinking — the support is then exact and ``τ`` is the sort-based reference's formula.

Rows holding NaN, or only ``−inf``, have no result: NaN everywhere (``sopfast.ops.counts``); other
rows holding ``+inf`` put uniform mass on their ``+inf`` entries.  Math in fp32 for fp32/fp16/bf16, in
fp64 for fp64.  Rows of up to ``THREAD_MAX_BLOCK`` entries (SOP's 20 groups) run **one thread per
row** (:func:`_sparsemax_thread_rows_kernel`: the row in that thread's registers as ``[A, ROWS, VEC]``,
``VEC`` consecutive entries per load, so every reduction is the thread's own and Michelot's steps
start at ``τ = max − 1``); rows of up to ``MAX_BLOCK`` entries are held in registers, several per
program; longer ones run the tiled kernels, one row per program, ``TILE`` entries per pass.  Their
Michelot steps (one pass over the row each) start from a lower bound found in the first pass, beside
the row's maximum: the largest of the tiles' own bisection brackets (a tile's threshold is at most
the row's, as a subset of the entries carries less mass above any τ).  That halves the passes of
rows whose support spans many tiles (20,000 entries of N(0, 0.3²): about 6 instead of 10) and leaves
the narrow supports' about 3.

Backward: ``(g − mean_S g) · 1_S`` on the support ``S = {p > 0}``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import on_device

# Rows of up to THREAD_MAX_BLOCK entries: one thread each, THREAD_ROWS_PER_PROGRAM rows (32 per warp)
# per program (a speed knob, not yet timed on a GPU).
THREAD_MAX_BLOCK = 32
THREAD_ROWS_PER_PROGRAM = 128
# Launch shape, tuned on an H200 (64k × 20 and 8k × 1000 rows): rows per program = elements // BLOCK.
FORWARD_ELEMENTS_PER_PROGRAM = 256
BACKWARD_ELEMENTS_PER_PROGRAM = 2048
ELEMENTS_PER_WARP = 512
BISECTION_STEPS = 4  # a speed knob only: the Michelot steps make τ exact from any lower bound
TILE_BISECTION_STEPS = 8  # per tile of a long row: the bound its Michelot passes start from
# Rows of up to MAX_BLOCK entries are held in registers; longer ones are processed TILE at a time.
MAX_BLOCK = 4096
TILE = 1024


def _compute_dtype(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _launch_shape(n_rows: int, n_cols: int, elements_per_program: int) -> tuple[int, int, int]:
    """``(BLOCK, ROWS, num_warps)``: a power-of-two block covering a row, rows per program, warps."""
    block = triton.next_power_of_2(n_cols)
    rows = max(1, min(elements_per_program // block, triton.next_power_of_2(n_rows)))
    return block, rows, min(8, max(1, rows * block // ELEMENTS_PER_WARP))


@triton.jit
def _sparsemax_bracket(z, BISECTION_STEPS: tl.constexpr):
    """Per row of shifted rows ``z [ROWS, BLOCK]`` (max 0, pads −inf), a lower bound ``[ROWS]`` of the
    simplex threshold within ``2^-BISECTION_STEPS`` of it: bisection on ``[max − 1, max]``."""
    lo = tl.max(z, axis=1) - 1.0  # mass(lo) >= 1 > mass(hi) = 0
    hi = lo + 1.0
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) * 0.5
        mass = tl.sum(tl.where(z > mid[:, None], z - mid[:, None], 0.0), axis=1)
        lo = tl.where(mass >= 1.0, mid, lo)
        hi = tl.where(mass >= 1.0, hi, mid)
    return lo


@triton.jit
def _sparsemax_threshold(z, BISECTION_STEPS: tl.constexpr):
    """Per-row simplex threshold ``τ [ROWS]`` of shifted rows ``z [ROWS, BLOCK]`` (max 0, pads −inf):
    bisection brackets it, then Michelot steps run until no row's support shrinks any more."""
    tau = _sparsemax_bracket(z, BISECTION_STEPS)
    size = tl.sum((z > tau[:, None]).to(tl.int32), axis=1)
    shrunk = tl.max(size) > 0
    while shrunk:
        support = z > tau[:, None]
        step = (tl.sum(tl.where(support, z, 0.0), axis=1) - 1.0) / tl.sum(support.to(z.dtype), axis=1)
        tau = tl.maximum(tau, step)
        new_size = tl.sum((z > tau[:, None]).to(tl.int32), axis=1)
        shrunk = tl.max(size - new_size) > 0
        size = new_size
    return tau


@triton.jit
def _sparsemax_forward_kernel(
    x_ptr,
    p_ptr,
    n_rows,
    n_cols,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    COMPUTE: tl.constexpr,
    BISECTION_STEPS: tl.constexpr,
):
    """``p [N, n] = sparsemax(x [N, n])`` for ``ROWS`` rows per program."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    in_bounds = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=in_bounds, other=float("-inf")).to(COMPUTE)

    row_max = tl.max(x, axis=1)
    z = x - row_max[:, None]
    tau = _sparsemax_threshold(z, BISECTION_STEPS)
    p = tl.where(z > tau[:, None], z - tau[:, None], 0.0)

    has_nan = tl.sum((x != x).to(tl.int32), axis=1) > 0
    posinf = x == float("inf")
    n_posinf = tl.sum(posinf.to(COMPUTE), axis=1)
    p = tl.where(n_posinf[:, None] > 0, posinf.to(COMPUTE) / tl.maximum(n_posinf, 1.0)[:, None], p)
    p = tl.where((has_nan | (row_max == float("-inf")))[:, None], float("nan"), p)
    tl.store(p_ptr + offsets, p.to(p_ptr.dtype.element_ty), mask=in_bounds)


@triton.jit
def _thread_rows_offsets(n_rows, n_cols: tl.constexpr, A: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr):
    """Offsets and bounds of this program's ``ROWS`` rows of ``[N, n]`` as ``[A, ROWS, VEC]`` (entry
    ``a·VEC + c`` of a row; ``VEC`` divides ``n``, so rows start at multiples of ``VEC``)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[None, :, None]
    vector = tl.arange(0, A)[:, None, None]
    col = vector * VEC + tl.arange(0, VEC)[None, None, :]
    in_bounds = tl.broadcast_to((row < n_rows) & (vector * VEC < n_cols), (A, ROWS, VEC))
    return tl.multiple_of(row * n_cols + col, [1, 1, VEC]), in_bounds


@triton.jit
def _sparsemax_thread_rows_kernel(
    x_ptr,
    p_ptr,
    n_rows,
    n_cols: tl.constexpr,
    A: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """``p = sparsemax(x)`` for ``ROWS`` rows of ``x [N, n]`` per program, one thread per row: the row as
    ``[A, ROWS, VEC]`` (entry ``a·VEC + c``; ``VEC`` divides ``n``, a constant: no register for the
    padding), Michelot's steps
    ``τ ← max(τ, (Σ_{z > τ} z − 1) / |{z > τ}|)`` from ``τ = −1`` on ``z = x − max`` until no row's
    support shrinks."""
    offsets, in_bounds = _thread_rows_offsets(n_rows, n_cols, A, ROWS, VEC)
    x = tl.load(x_ptr + offsets, mask=in_bounds, other=float("-inf")).to(COMPUTE)

    row_max = tl.max(tl.max(x, axis=2, keep_dims=True), axis=0, keep_dims=True)
    n_posinf = tl.sum(tl.sum((x == float("inf")).to(COMPUTE), axis=2, keep_dims=True), axis=0, keep_dims=True)
    n_nan = tl.sum(tl.sum((x != x).to(tl.int32), axis=2, keep_dims=True), axis=0, keep_dims=True)
    z = x - row_max  # where the maximum is +inf (and no NaN), exactly the +inf entries are NaN
    tau = tl.full(row_max.shape, -1.0, COMPUTE)
    size = tl.full(row_max.shape, -1, tl.int32)
    shrinking = True
    while shrinking:  # sass-loop: triton_sparsemax_michelot
        support = z > tau
        total = tl.sum(tl.sum(tl.where(support, z, 0.0), axis=2, keep_dims=True), axis=0, keep_dims=True)
        count = tl.sum(tl.sum(support.to(tl.int32), axis=2, keep_dims=True), axis=0, keep_dims=True)
        shrinking = tl.max(tl.max(tl.max((count != size).to(tl.int32), axis=2), axis=1), axis=0) > 0
        size = count
        tau = tl.maximum(tau, (total - 1.0) / tl.maximum(count, 1).to(COMPUTE))
    p = tl.maximum(z - tau, 0.0)
    p = tl.where(n_posinf > 0, tl.where(z != z, 1.0 / tl.maximum(n_posinf, 1.0), 0.0), p)
    p = tl.where((n_nan > 0) | (row_max == float("-inf")), float("nan"), p)
    tl.store(p_ptr + offsets, p.to(p_ptr.dtype.element_ty), mask=in_bounds)


@triton.jit
def _sparsemax_thread_rows_backward_kernel(
    p_ptr,
    grad_ptr,
    out_ptr,
    n_rows,
    n_cols: tl.constexpr,
    A: tl.constexpr,
    ROWS: tl.constexpr,
    VEC: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """``out = (g − mean_S g) · 1_S`` with ``S = {p > 0}``, one thread per row (see the forward)."""
    offsets, in_bounds = _thread_rows_offsets(n_rows, n_cols, A, ROWS, VEC)
    support = tl.load(p_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE) > 0
    g = tl.load(grad_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)
    size = tl.sum(tl.sum(support.to(COMPUTE), axis=2, keep_dims=True), axis=0, keep_dims=True)
    total = tl.sum(tl.sum(tl.where(support, g, 0.0), axis=2, keep_dims=True), axis=0, keep_dims=True)
    out = tl.where(support, g - total / tl.maximum(size, 1.0), 0.0)
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=in_bounds)


@triton.jit
def _sparsemax_backward_kernel(
    p_ptr, grad_ptr, out_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr, COMPUTE: tl.constexpr
):
    """``out [N, n] = (g − mean_S g) · 1_S`` with ``S = {p > 0}`` per row, ``ROWS`` rows per program."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    in_bounds = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None] * n_cols + cols[None, :]
    p = tl.load(p_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)
    g = tl.load(grad_ptr + offsets, mask=in_bounds, other=0).to(COMPUTE)

    support = p > 0
    size = tl.maximum(tl.sum(support.to(COMPUTE), axis=1), 1.0)
    mean = tl.sum(tl.where(support, g, 0.0), axis=1) / size
    out = tl.where(support, g - mean[:, None], 0.0)
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=in_bounds)


TAU_MARGIN: tl.constexpr = tl.constexpr(2.0**-12)


@triton.jit
def _sparsemax_tiled_forward_kernel(
    x_ptr, p_ptr, n_cols, TILE: tl.constexpr, COMPUTE: tl.constexpr, BISECTION_STEPS: tl.constexpr
):
    """Sparsemax of one long row per program, ``TILE`` entries per pass: the row's statistics and a
    lower bound of its threshold (the largest tile threshold bracket, in ``x``), then Michelot's steps
    ``τ ← (Σ_{z > τ} z − 1) / |{z > τ}|`` on ``z = x − max`` from that bound until the support stops
    shrinking, then the output."""
    base = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, TILE)
    row_max = tl.full([], float("-inf"), COMPUTE)
    best_max = tl.full([], float("-inf"), COMPUTE)  # the bound: best_max + best_lo, kept apart so
    best_lo = tl.full([], -1.0, COMPUTE)  # that huge entries do not round the bracket away
    n_posinf = tl.zeros([], COMPUTE)
    n_nan = tl.zeros([], tl.int32)
    for start in range(0, n_cols, TILE):
        x = tl.load(x_ptr + base + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(COMPUTE)
        tile_max = tl.max(tl.where(x == x, x, float("-inf")), axis=0)
        z = tl.where(x == x, x - tile_max, float("-inf"))[None, :]
        tile_lo = tl.max(_sparsemax_bracket(z, BISECTION_STEPS), axis=0)
        better = tile_max + tile_lo > best_max + best_lo  # NaN (tiles of -inf or +inf) never is
        best_max = tl.where(better, tile_max, best_max)
        best_lo = tl.where(better, tile_lo, best_lo)
        row_max = tl.maximum(row_max, tile_max)
        n_posinf += tl.sum((x == float("inf")).to(COMPUTE), axis=0)
        n_nan += tl.sum((x != x).to(tl.int32), axis=0)
    # in z: at least -1 (the maximum alone); less a margin for the rounding of the tile sums
    tau = tl.maximum((best_max - row_max) + best_lo, -1.0)
    tau = tl.maximum(tau - TAU_MARGIN, -1.0)
    size = tl.full([], -1, tl.int32)
    shrinking = (n_posinf == 0) & (n_nan == 0) & (row_max > float("-inf"))
    while shrinking:
        total = tl.zeros([], COMPUTE)
        count = tl.zeros([], tl.int32)
        for start in range(0, n_cols, TILE):
            z = tl.load(x_ptr + base + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(COMPUTE)
            z = z - row_max
            total += tl.sum(tl.where(z > tau, z, 0.0), axis=0)
            count += tl.sum((z > tau).to(tl.int32), axis=0)
        shrinking = count != size
        size = count
        tau = tl.maximum(tau, (total - 1.0) / tl.maximum(count, 1).to(COMPUTE))
    undefined = (n_nan > 0) | (row_max == float("-inf"))
    for start in range(0, n_cols, TILE):
        in_row = start + cols < n_cols
        x = tl.load(x_ptr + base + start + cols, mask=in_row, other=float("-inf")).to(COMPUTE)
        p = tl.maximum(x - row_max - tau, 0.0)
        p = tl.where(n_posinf > 0, tl.where(x == float("inf"), 1.0 / tl.maximum(n_posinf, 1.0), 0.0), p)
        p = tl.where(undefined, float("nan"), p)
        tl.store(p_ptr + base + start + cols, p.to(p_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def _sparsemax_tiled_backward_kernel(p_ptr, grad_ptr, out_ptr, n_cols, TILE: tl.constexpr, COMPUTE: tl.constexpr):
    """``(g − mean_S g) · 1_S`` of one long row per program, ``TILE`` entries per pass."""
    base = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, TILE)
    total = tl.zeros([], COMPUTE)
    size = tl.zeros([], COMPUTE)
    for start in range(0, n_cols, TILE):
        in_row = start + cols < n_cols
        support = tl.load(p_ptr + base + start + cols, mask=in_row, other=0).to(COMPUTE) > 0
        g = tl.load(grad_ptr + base + start + cols, mask=in_row, other=0).to(COMPUTE)
        total += tl.sum(tl.where(support, g, 0.0), axis=0)
        size += tl.sum(support.to(COMPUTE), axis=0)
    mean = total / tl.maximum(size, 1.0)
    for start in range(0, n_cols, TILE):
        in_row = start + cols < n_cols
        support = tl.load(p_ptr + base + start + cols, mask=in_row, other=0).to(COMPUTE) > 0
        g = tl.load(grad_ptr + base + start + cols, mask=in_row, other=0).to(COMPUTE)
        tl.store(
            out_ptr + base + start + cols, tl.where(support, g - mean, 0.0).to(out_ptr.dtype.element_ty), mask=in_row
        )


def _thread_rows_shape(n_rows: int, n_cols: int, element_size: int) -> dict:
    """``A``, ``ROWS``, ``VEC`` and ``num_warps`` of the one-thread-per-row kernels: ``VEC`` entries per
    load (16 bytes at most) dividing ``n``."""
    vec = next(v for v in (4, 2, 1) if v * element_size <= 16 and n_cols % v == 0)
    rows = max(32, min(THREAD_ROWS_PER_PROGRAM, triton.next_power_of_2(n_rows)))
    return dict(A=triton.cdiv(triton.next_power_of_2(n_cols), vec), ROWS=rows, VEC=vec, num_warps=rows // 32)


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [N, n], got shape {tuple(t.shape)}")


def sparsemax_forward(x: torch.Tensor) -> torch.Tensor:
    """Sparsemax over the last dim of ``x [N, n]``; same dtype (fp64 is computed in fp64)."""
    _check_rows("x", x)
    x = x.contiguous()
    p = torch.empty_like(x)
    n_rows, n_cols = x.shape
    if p.numel() == 0:
        return p
    compute = _compute_dtype(x.dtype)
    with on_device(x):
        if n_cols <= THREAD_MAX_BLOCK:
            shape = _thread_rows_shape(n_rows, n_cols, x.element_size())
            _sparsemax_thread_rows_kernel[(triton.cdiv(n_rows, shape["ROWS"]),)](
                x, p, n_rows, n_cols, COMPUTE=compute, **shape
            )
            return p
        if n_cols > MAX_BLOCK:
            _sparsemax_tiled_forward_kernel[(n_rows,)](
                x, p, n_cols, TILE=TILE, COMPUTE=compute, BISECTION_STEPS=TILE_BISECTION_STEPS
            )
            return p
        block, rows, num_warps = _launch_shape(n_rows, n_cols, FORWARD_ELEMENTS_PER_PROGRAM)
        _sparsemax_forward_kernel[(triton.cdiv(n_rows, rows),)](
            x,
            p,
            n_rows,
            n_cols,
            ROWS=rows,
            BLOCK=block,
            COMPUTE=compute,
            BISECTION_STEPS=BISECTION_STEPS,
            num_warps=num_warps,
        )
    return p


def sparsemax_backward(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Input gradient ``[N, n]`` (``grad``'s dtype) of sparsemax given its output ``p`` and ``grad``."""
    _check_rows("p", p)
    if grad.shape != p.shape:
        raise ValueError(f"grad shape {tuple(grad.shape)} must equal p shape {tuple(p.shape)}")
    p, grad = p.contiguous(), grad.contiguous()
    out = torch.empty_like(grad)
    n_rows, n_cols = p.shape
    if out.numel() == 0:
        return out
    compute = _compute_dtype(grad.dtype)
    with on_device(grad):
        if n_cols <= THREAD_MAX_BLOCK:
            shape = _thread_rows_shape(n_rows, n_cols, grad.element_size())
            _sparsemax_thread_rows_backward_kernel[(triton.cdiv(n_rows, shape["ROWS"]),)](
                p, grad, out, n_rows, n_cols, COMPUTE=compute, **shape
            )
            return out
        if n_cols > MAX_BLOCK:
            _sparsemax_tiled_backward_kernel[(n_rows,)](p, grad, out, n_cols, TILE=TILE, COMPUTE=compute)
            return out
        block, rows, num_warps = _launch_shape(n_rows, n_cols, BACKWARD_ELEMENTS_PER_PROGRAM)
        _sparsemax_backward_kernel[(triton.cdiv(n_rows, rows),)](
            p, grad, out, n_rows, n_cols, ROWS=rows, BLOCK=block, COMPUTE=compute, num_warps=num_warps
        )
    return out
