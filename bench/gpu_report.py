"""The GPU report of sopfast (issues #12, #24): end-to-end speed, correctness and kernel bandwidth on
one GPU, in one command of at most 8 minutes on an H100 or H200, from the source tree::

    PYTHONPATH=.:python python bench/gpu_report.py                 # writes bench/RESULTS_gpu.md
    PYTHONPATH=.:python python bench/gpu_report.py --dry-run       # tiny shapes on the CPU, same code paths

Lease-ready: the headline numbers come first, every section may start checks only within its own
budget (``SECTION_BUDGET_S``, 7 minutes in all), and the Markdown is rewritten after every check, so a
run that is cut off keeps what it measured.  The extension must be built first (it registers the
kernels in PyTorch's dispatcher when sopfast is imported); bench/gpu_script.py does both, in order.

Sections (each check runs in isolation: a failure is recorded and the next check runs):

In the order they run:

1. **end to end** — ViT-B/16 at 224 (random-init HF ``ViTForImageClassification``, 1000 classes;
   forward at batch 64 and 128, training step at 16 and 32) and BERT-base at 512 tokens (forward 16,
   training step 4), m = 20, τ = 0.2, bf16 autocast: the authors' algorithm
   (``sopfast.model.reference.reference_forward``), ``mode="exact"`` and ``mode="drop"`` (also on the
   other backends) interleaved in one process, 3 warm-up rounds, 10 timed: median/min/max ms,
   samples/s, × reference and ``max_memory_allocated``; a training step is loss backward + AdamW
   on ``model.trainable_parameters()``;
2. **gates** — fp32 with TF32 off: exact equals the authors' algorithm (masks identical, logits
   within 1e-4 relative); bf16: exact's mask mismatch and p95 logit error against the fp32 authors'
   algorithm at most 1.5× the authors' own in bf16 (a NaN fails);
3. **CPU = device** — the same SOP weights on the CPU and on the GPU (fp32): identical groups,
   logits within 1e-3;
4. **ops vs reference** — every op (sparsemax, top_tau with both tie rules, gather_tokens) on the
   ``cuda`` and ``triton`` backends against the PyTorch reference over shapes (register and
   block/tiled paths), dtypes and special values (NaN, NaN with the sign bit, ±inf, +inf beside NaN,
   ties, saturated and uniform rows, subnormal attention), forward and backward, on the rows that
   have a result (rows without one must be blank); with the authors' tie rule the group must be
   the top-k of the kernel's own attention and may differ from the reference's only at near ties;
   gather_tokens also past 2³¹ output elements and past 2³¹ output rows (checked on sampled rows);
5. **kernel timings** — Triton's ``do_bench`` (median) at 65,536 rows or more, GB/s of the bytes an
   ideal kernel moves and % of the card's peak bandwidth (H100 3350 GB/s, H200 4800 GB/s, found by
   name), for each backend and the PyTorch reference; plus Triton launch-shape alternatives.

``--dry-run`` runs the same functions on tiny shapes on the CPU: the native backends are then ``cpp``
and ``triton`` (its interpreter), timings use ``time.perf_counter`` and the backbones are tiny.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import itertools
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DRY_RUN = "--dry-run" in sys.argv
if DRY_RUN or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton on CPU tensors (set before triton loads)

import sopfast  # noqa: E402
from sopfast.benchmark import step_functions  # noqa: E402
from sopfast.model.reference import reference_forward  # noqa: E402
from sopfast.ops import (  # noqa: E402
    TopTauResult,
    _backends,
    gather_tokens_backward_reference,
    gather_tokens_reference,
    gaussian_kernel1d,
    sparsemax_backward_reference,
    sparsemax_reference,
    top_tau_backward_reference,
    top_tau_reference,
)
from sopfast.ops.top_tau import _ranking as top_tau_ranking  # noqa: E402

PEAK_GBPS_BY_NAME = {"H200": 4800.0, "H100": 3350.0}
TOP_TAU_CHECK_ROWS = 129
# the Triton launch-shape sweep: the module constants the kernels' launch code reads now, per swept op —
# top_tau forward (rows of <= 1,024): rows (= warps) per program x bits per radix reduction (at most 3 fit
# rows of 196); sparsemax over <= 32 columns (one thread per row): rows per program (32 per warp)
SWEEP_KNOBS: dict[str, dict[str, tuple[int, ...]]] = {
    "top_tau": {"ROWS_PER_PROGRAM": (1, 2, 4, 8), "RADIX_BITS": (1, 2, 3)},
    "sparsemax": {"THREAD_ROWS_PER_PROGRAM": (32, 64, 128, 256)},
}
TIME_BUDGET_S = 7 * 60  # stop starting checks after this: the run must fit in 8 minutes
# seconds each section may start checks for, in the order they run (end to end first)
SECTION_BUDGET_S = {"e2e": 200.0, "gates": 40.0, "agreement": 25.0, "ops": 80.0, "timings": 100.0}
TIMING_ROWS = 65536  # kernel timings at >= 64k rows: the GPU full, launch cost amortised
INF = float("inf")
NEAR_TIE_ULPS = 4  # reference attention this near its k-th value may rank either side of the cut
ATOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


# ----------------------------------------------------------------------------- the report


@dataclass
class Check:
    section: str
    name: str
    status: str  # ok | FAIL | error | skipped
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    device: torch.device
    dry_run: bool
    deadline: float
    checks: list[Check] = field(default_factory=list)
    tables: dict[str, list[str]] = field(default_factory=dict)
    output: Path | None = None  # rewritten after every check: a run cut off keeps what it has
    started: float = field(default_factory=time.monotonic)
    section_deadline: float = math.inf
    environment: list[str] = field(default_factory=list)
    writer: Callable[[Report], None] | None = None  # replaces write_markdown (bench/gpu_script.py)

    def begin(self, section: str, seconds: float) -> None:
        """Starts a section that may start checks for ``seconds`` (and not past the run's deadline)."""
        self.section_deadline = time.monotonic() + seconds
        print(f"== {section} (at most {seconds:.0f} s)", flush=True)

    def run(self, section: str, name: str, fn: Callable[[], str | None]) -> None:
        """Runs one check in isolation; ``fn`` returns a detail string, raises AssertionError to fail."""
        now = time.monotonic()
        if now > self.deadline or now > self.section_deadline:
            which = "run" if now > self.deadline else "section"
            self.checks.append(Check(section, name, "skipped", f"{which} time budget spent"))
            self.write()
            return
        start = time.monotonic()
        try:
            detail = fn() or ""
            status = "ok"
        except AssertionError as error:
            status, detail = "FAIL", str(error)[:300]
        except Exception as error:  # one broken check must not hide the others
            status, detail = "error", f"{type(error).__name__}: {str(error)[:300]}"
            traceback.print_exc(limit=3)
        self.checks.append(Check(section, name, status, detail.replace("|", "/"), time.monotonic() - start))
        print(f"[{status:>5}] {section} / {name} {detail[:160]}", flush=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.write()

    def write(self) -> None:
        if self.writer is not None:
            self.writer(self)
        elif self.output is not None:
            write_markdown(self, self.output, self.started)

    def row(self, table: str, cells: list[object]) -> None:
        self.tables.setdefault(table, []).append("| " + " | ".join(str(c) for c in cells) + " |")


def native_backends(device: torch.device) -> list[str]:
    """The native backends that run on ``device``: cuda and triton on a GPU; cpp, and triton in its
    interpreter, on the CPU."""
    available = _backends.available_backends()
    if device.type == "cuda":
        return [b for b in ("cuda", "triton") if available[b]]
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    return [b for b in ("cpp", "triton") if available[b] and (b != "triton" or interpreting)]


def forced_backend(name: str | None) -> contextlib.AbstractContextManager:
    """``sopfast.ops.use_backend(name)``, or nothing for ``None`` and for the backend that runs anyway."""
    if name is None or name == _backends.select_backend(torch.empty(0, device=_device_of(name))):
        return contextlib.nullcontext()
    return sopfast.ops.use_backend(name)


def _device_of(backend: str | None) -> str:
    return "cuda" if backend in ("cuda", "triton") and torch.cuda.is_available() else "cpu"


def kernel(op: str, backend: str) -> Callable:
    return _backends.OPS[op].implementation(backend)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    both_nan = a.isnan() & b.isnan()
    return (
        float((a.double() - b.double()).abs().masked_fill(both_nan, 0).nan_to_num(nan=math.inf).max())
        if a.numel()
        else 0.0
    )


def assert_close(name: str, a: torch.Tensor, b: torch.Tensor, atol: float) -> float:
    diff = max_diff(a, b)
    assert diff <= atol, f"{name}: max |diff| {diff:.2e} > {atol:.0e}"
    return diff


# ----------------------------------------------------------------------------- 1. ops vs reference


def special_sparsemax_rows(n: int, dtype: torch.dtype, device: torch.device, rows: int) -> torch.Tensor:
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n)) * 3
    x[0, 0], x[0, -1] = INF, float("nan")  # +inf beside NaN: the mass on the +inf entry
    x[1] = -INF
    x[2, n // 2] = float("nan")
    x[3] = 0.5  # all tied
    x[4] = x[4] * 1e29  # huge values
    x[5, : max(1, n // 3)] = INF
    return x.to(device, dtype)


def check_sparsemax(report: Report, n: int, dtype: torch.dtype, rows: int) -> None:
    x = special_sparsemax_rows(n, dtype, report.device, rows)
    p_ref = sparsemax_reference(x)
    g = torch.randn_like(x)
    for backend in native_backends(report.device):

        def run(backend=backend) -> str:
            p = kernel("sparsemax_forward", backend)(x)
            forward = assert_close("forward", p, p_ref, ATOL[dtype])
            grad = kernel("sparsemax_backward", backend)(p_ref, g)
            expected = sparsemax_backward_reference(p_ref, g)
            backward = assert_close(
                "backward", grad, expected, {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 0.05)
            )
            return f"fwd {forward:.1e}, bwd {backward:.1e}"

        report.run("ops", f"sparsemax {backend} {rows}x{n} {str(dtype)[6:]}", run)


def negative_nan() -> float:
    return torch.tensor([0xFFC00000], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


def subnormal_band() -> list[float]:
    """Logits in [-104, -87] (subnormal fp32 attention next to a 0 logit), away from rounding boundaries."""
    values = [-87.5 - 0.5 * i for i in range(30)] + [-102.5 + 0.03 * i for i in range(-30, 30)]
    return [x for x in values if abs(math.exp(x) / 2.0**-149 % 1 - 0.5) > 0.1]


def top_tau_logits(d: int, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Random rows plus special ones: saturated, uniform, duplicates, NaN (sign bit set), ±inf, subnormal."""
    gen = torch.Generator().manual_seed(d)
    x = torch.randn(rows, d, generator=gen)
    x[0] *= 1e3  # saturated: most attention underflows to 0
    x[1] = 0.25  # uniform
    x[2] = torch.randint(-2, 3, (d,), generator=gen).float()  # exact duplicates
    x[3, d // 2] = negative_nan()
    x[4, 0], x[4, -1] = INF, -INF
    x[5, : d // 4] = -INF
    band = subnormal_band()[: d - 1]
    x[6] = -INF
    x[6, 0] = 0.0
    x[6, 1 : 1 + len(band)] = torch.tensor(band)
    return x.to(device, dtype)


def authors_mask(attention: torch.Tensor, k: torch.Tensor, valid: torch.Tensor | None, largest: bool) -> torch.Tensor:
    """The top-``k`` of fp32 ``attention [N, d]`` by the authors' rule (a stable ascending sort, flipped for
    the largest: equal values higher index first), over the ``valid`` features."""
    every = torch.ones_like(attention, dtype=torch.bool) if valid is None else valid
    order = top_tau_ranking(attention, every, largest, higher_first=largest)
    positions = torch.arange(attention.shape[1], device=attention.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    return rank < k.view(-1, 1)


def rows_beyond_near_ties(
    mask: torch.Tensor,
    reference: TopTauResult,
    k: torch.Tensor,
    valid: torch.Tensor | None,
    largest: bool,
    ulps: float = NEAR_TIE_ULPS,
) -> torch.Tensor:
    """``[N]`` bool: rows where ``mask`` and the reference's mask differ at a feature whose reference
    attention lies more than ``ulps`` ulp from the reference's ``k``-th value (nearer, the kernel's exp and
    torch's softmax exp may order the pair differently)."""
    a = reference.attention.float()
    outside = float("-inf") if largest else float("inf")
    ranked = torch.sort(a.masked_fill(~valid, outside) if valid is not None else a, dim=-1, descending=largest).values
    kth = ranked.gather(-1, (k.view(-1, 1) - 1).clamp_min(0))
    ulp = (kth.abs() * torch.finfo(torch.float32).eps).clamp_min(torch.finfo(torch.float32).smallest_normal * 2.0**-23)
    near = (a - kth).abs() <= ulps * ulp
    return ((mask != reference.mask) & ~near).any(dim=-1)


def indices_of(mask: torch.Tensor, width: int) -> torch.Tensor:
    """The ascending positions of ``mask [N, d]``'s kept features, ``-1``-padded to ``width``."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    keyed = torch.where(mask, positions, mask.shape[1] + positions)
    first = torch.sort(keyed, dim=-1).values[:, :width]
    return torch.where(first < mask.shape[1], first, torch.full_like(first, -1))


def check_top_tau(
    report: Report, d: int, grid, dtype: torch.dtype, ties_authors: bool, largest: bool, with_valid: bool, blur: int
) -> None:
    """A kernel against the reference on the rows that have a result (rows without one must be blank on
    both).  Ranking the logits, the groups must be the reference's.  With the authors' rule the group
    must be the top-k of the kernel's *own* attention (the rule, exactly), and may differ from the
    reference's only at features whose reference attention lies within NEAR_TIE_ULPS ulp of its k-th
    value: the kernels' exp and torch's softmax exp round such pairs apart differently."""
    rows = TOP_TAU_CHECK_ROWS if not report.dry_run else 9
    logits = top_tau_logits(d, rows, dtype, report.device)
    k = torch.full((rows,), max(1, d // 5), dtype=torch.int64, device=report.device)
    valid = None
    if with_valid:
        valid = torch.rand(rows, d, generator=torch.Generator().manual_seed(1)).to(report.device) > 0.3
        valid[:, 0] = True
        k = torch.minimum(k, valid.sum(dim=-1))
    kernel_1d = (
        gaussian_kernel1d(blur, 1.0, report.device).to(torch.float64 if dtype == torch.float64 else torch.float32)
        if blur
        else None
    )
    grid_h, grid_w = grid if (grid and blur) else (0, 0)
    args = (logits, k, int(k.max()), valid, largest, ties_authors, kernel_1d, grid_h, grid_w)
    with torch.no_grad():
        expected = top_tau_reference(*args[:5], *args[6:], ties_authors=ties_authors)
    result = ~torch.isnan(expected.lam)
    grad_lam, grad_attention = torch.randn_like(expected.lam), torch.randn_like(expected.attention)
    backward_args = (
        expected.attention,
        expected.mask,
        expected.lam,
        grad_lam,
        grad_attention,
        kernel_1d,
        grid_h,
        grid_w,
    )
    grad_expected = top_tau_backward_reference(*backward_args)
    rule, end = "authors" if ties_authors else "logits", "largest" if largest else "smallest"
    blur_name = f" blur{blur}-{'2d' if grid_h else '1d'}" if blur else ""
    name = f"top_tau d={d} {str(dtype)[6:]} {rule} {end}{' valid' if with_valid else ''}{blur_name}"
    for backend in native_backends(report.device):
        if backend == "cuda" and d > 16384:
            continue

        def run(backend=backend) -> str:
            indices, mask, lam, attention = kernel("top_tau_forward", backend)(*args)
            blank = ~result
            assert torch.isnan(lam[blank]).all() and not mask[blank].any() and (indices[blank] == -1).all(), (
                "rows without a result are not blank"
            )
            assert torch.equal(indices, indices_of(mask, indices.shape[1])), "indices are not the mask's positions"
            if ties_authors:
                own = (authors_mask(attention, k, valid, largest) != mask)[result].any(dim=-1)
                assert not own.any(), f"{int(own.sum())} rows: the group is not the top-k of the kernel's attention"
                far = rows_beyond_near_ties(mask, expected, k, valid, largest)[result]
                assert not far.any(), f"{int(far.sum())} of {rows} rows differ from the reference beyond near ties"
                near = int(((mask != expected.mask).any(dim=-1) & result).sum())
            else:
                near = 0
                bad = ((mask != expected.mask).any(dim=-1) & result).sum()
                assert bad == 0, f"{int(bad)} of {rows} rows select other features than the reference"
            tolerance = 2e-6 if dtype != torch.float64 else 1e-12
            att = assert_close("attention", attention[result], expected.attention[result], tolerance)
            assert_close("lam", lam[result], expected.lam[result], 1e-5)
            grad = kernel("top_tau_backward", backend)(*backward_args)
            bwd = assert_close("backward", grad[result], grad_expected[result], 1e-5)
            skipped = f", {int(blank.sum())} rows without a result" if blank.any() else ""
            ties = f", {near} rows differ at near ties" if near else ""
            return f"groups ok{ties}{skipped}; attention {att:.1e}, bwd {bwd:.1e}"

        report.run("ops", f"{name} {backend}", run)


def check_gather(report: Report, b: int, t: int, e: int, m: int, k: int, prefix: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(e)
    x = torch.randn(b, t, e, generator=gen).to(report.device, dtype)
    indices = torch.randint(-1, t, (b, m, k), generator=gen).to(report.device)
    grad = torch.randn(b * m, prefix + k, e, generator=gen).to(report.device, dtype)
    expected = gather_tokens_reference(x, indices, prefix)
    expected_grad = gather_tokens_backward_reference(grad, indices, prefix, t)
    for backend in native_backends(report.device):

        def run(backend=backend) -> str:
            out = kernel("gather_tokens_forward", backend)(x, indices, prefix)
            assert torch.equal(out, expected), "forward differs from the reference (a copy: must be exact)"
            grad_x = kernel("gather_tokens_backward", backend)(grad, indices, prefix, t)
            tolerance = {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 0.1)
            bwd = assert_close("backward", grad_x, expected_grad, tolerance)
            return f"forward exact, bwd {bwd:.1e}"

        report.run("ops", f"gather_tokens {backend} B{b} T{t} E{e} m{m} k{k}+{prefix} {str(dtype)[6:]}", run)


def check_huge_gather(report: Report, b: int, t: int, e: int, m: int, k: int, prefix: int, backward: bool) -> None:
    """Outputs past 2³¹ elements or rows, checked on sampled group rows (and the last one); the
    backward against the reference per batch element."""
    rows, elements = b * m * (prefix + k), b * m * (prefix + k) * e
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(b, t, e, generator=gen).to(report.device, torch.bfloat16)
    indices = torch.randint(-1, t, (b, m, k), generator=gen).to(report.device)
    samples = torch.cat([torch.randint(0, b * m, (64,), generator=gen), torch.tensor([b * m - 1])]).to(report.device)
    for backend in native_backends(report.device):

        def run(backend=backend) -> str:
            out = kernel("gather_tokens_forward", backend)(x, indices, prefix)
            picked = out[samples]
            del out
            # the sampled rows, built directly: the prefix tokens, then the indexed ones (-1: zero)
            body = indices.reshape(b * m, k)[samples]
            tokens = torch.cat([torch.arange(prefix, device=x.device).expand(len(samples), prefix), body], dim=1)
            expected = x[(samples // m).view(-1, 1), tokens.clamp_min(0)].masked_fill((tokens < 0).unsqueeze(-1), 0)
            assert torch.equal(picked, expected), "sampled rows differ from the reference"
            detail = f"{rows:,} rows, {elements:,} elements: sampled rows exact"
            if backward:
                grad = torch.ones(b * m, prefix + k, e, dtype=torch.bfloat16, device=x.device)
                grad_x = kernel("gather_tokens_backward", backend)(grad, indices, prefix, t)
                for bb in range(b):
                    chunk = gather_tokens_backward_reference(
                        grad[bb * m : (bb + 1) * m], indices[bb : bb + 1], prefix, t
                    )
                    assert_close("backward", grad_x[bb : bb + 1].float(), chunk.float(), 0.5)
                detail += ", backward equal"
            return detail

        report.run("ops", f"gather_tokens {backend} past 2^31: {rows:,} rows x E{e}", run)


def ops_checks(dry: bool) -> list[tuple[Callable[..., None], tuple]]:
    """The checks of the ops section: ``(check, its arguments after the report)`` (also the shapes
    bench/triton_compile_check.py compiles)."""
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
    checks: list[tuple[Callable[..., None], tuple]] = []
    for n in [3, 20, 70] if dry else [3, 20, 33, 1000, 5000, 20000]:
        for dtype in dtypes if n == 20 else [torch.float32, torch.bfloat16]:
            checks.append((check_sparsemax, (n, dtype, 9 if dry else 257)))
    shapes = (
        [(12, None), (49, (7, 7))]
        if dry
        else [
            (12, None),
            (49, (7, 7)),
            (196, (14, 14)),
            (512, None),
            (1024, (32, 32)),
            (3000, None),
            (10000, (100, 100)),
        ]
    )
    for d, grid in shapes:
        blur = 3 if d >= 12 else 0
        checks += [
            (check_top_tau, (d, grid, torch.float32, True, True, False, blur)),
            (check_top_tau, (d, grid, torch.bfloat16, False, False, True, 0)),
            (check_top_tau, (d, grid, torch.float32, True, False, True, blur)),
            (check_top_tau, (d, grid, torch.float32, False, True, False, blur)),
        ]
    d, grid = shapes[-1] if dry else (196, (14, 14))
    for dtype in (torch.float16, torch.float64):
        checks.append((check_top_tau, (d, grid, dtype, True, True, True, 3)))
    for dtype in dtypes:
        checks.append((check_gather, (2, 9, 12, 3, 5, 1, dtype) if dry else (8, 197, 768, 20, 39, 1, dtype)))
    if dry:
        checks.append((check_huge_gather, (2, 9, 4, 3, 5, 1, True)))
        checks.append((check_huge_gather, (1, 40, 1, 64, 1, 33, False)))
    else:
        checks.append((check_huge_gather, (16, 3000, 1024, 64, 2560, 1, True)))  # > 2^31 elements
        checks.append((check_huge_gather, (1, 4097, 1, 2**19, 1, 4096, False)))  # > 2^31 rows
    return checks


def ops_section(report: Report) -> None:
    for check, args in ops_checks(report.dry_run):
        check(report, *args)


# ----------------------------------------------------------------------------- 2. kernel timings


def time_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds per call: Triton's ``do_bench`` on a GPU (L2 flushed between calls, at
    least ``repeats`` calls), ``time.perf_counter`` on the CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        fn()  # compiles outside the timed calls
        return float(do_bench(fn, warmup=25, rep=max(100, repeats * 2), return_mode="median"))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_gbps(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_GBPS_BY_NAME.items() if key in name), None)


def nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


TimingCase = tuple[str, int, dict[str, Callable[[], object]]]  # (name, ideal bytes moved, {impl: call})


def sparsemax_timing_cases(rows: int, n: int, device: torch.device) -> list[TimingCase]:
    x = torch.randn(rows, n, device=device) * 2
    g = torch.randn_like(x)
    p = sparsemax_reference(x)
    forward = {b: (lambda b=b: kernel("sparsemax_forward", b)(x)) for b in native_backends(device)}
    backward = {b: (lambda b=b: kernel("sparsemax_backward", b)(p, g)) for b in native_backends(device)}
    return [
        (f"sparsemax fwd {rows}x{n} fp32", nbytes(x, x), {**forward, "torch": lambda: sparsemax_reference(x)}),
        (
            f"sparsemax bwd {rows}x{n} fp32",
            nbytes(p, g, g),
            {**backward, "torch": lambda: sparsemax_backward_reference(p, g)},
        ),
    ]


def top_tau_timing_cases(
    rows: int, d: int, grid, blur: int, dtype: torch.dtype, ties_authors: bool, device
) -> list[TimingCase]:
    logits = torch.randn(rows, d, device=device, dtype=dtype)
    k_max = d // 5
    k = torch.full((rows,), k_max, device=device)
    blur_kernel = gaussian_kernel1d(blur, 1.0, device) if blur else None
    args = (logits, k, k_max, None, True, ties_authors, blur_kernel, *(grid if blur else (0, 0)))
    moved = nbytes(logits, k) + rows * d * (4 + 1) + rows * (8 * k_max + 4)
    impls = {b: (lambda b=b: kernel("top_tau_forward", b)(*args)) for b in native_backends(device)}

    def reference():
        with torch.no_grad():
            return top_tau_reference(*args[:5], *args[6:], ties_authors=ties_authors)

    rule = "authors" if ties_authors else "logits"
    return [
        (
            f"top_tau fwd {rows}x{d} {str(dtype)[6:]} {'blur3 ' if blur else ''}{rule}",
            moved,
            {**impls, "torch": reference},
        )
    ]


def top_tau_backward_timing_cases(rows: int, device: torch.device) -> list[TimingCase]:
    a = torch.softmax(torch.randn(rows, 196, device=device), -1)
    mask = torch.rand(rows, 196, device=device) > 0.8
    lam, grad_lam, grad_a = torch.randn(rows, device=device), torch.randn(rows, device=device), torch.randn_like(a)
    args = (a, mask, lam, grad_lam, grad_a, gaussian_kernel1d(3, 1.0, device), 14, 14)
    impls = {b: (lambda b=b: kernel("top_tau_backward", b)(*args)) for b in native_backends(device)}
    moved = nbytes(a, mask, lam, grad_lam, grad_a, a)
    return [(f"top_tau bwd {rows}x196 blur3", moved, {**impls, "torch": lambda: top_tau_backward_reference(*args)})]


def gather_timing_cases(b: int, t: int, e: int, m: int, k: int, device: torch.device) -> list[TimingCase]:
    x = torch.randn(b, t, e, device=device, dtype=torch.bfloat16)
    indices = torch.rand(b, m, t - 1, device=device).topk(k, dim=-1).indices.sort(dim=-1).values + 1
    grad = torch.randn(b * m, 1 + k, e, device=device, dtype=torch.bfloat16)
    forward = {bk: (lambda bk=bk: kernel("gather_tokens_forward", bk)(x, indices, 1)) for bk in native_backends(device)}
    backward = {
        bk: (lambda bk=bk: kernel("gather_tokens_backward", bk)(grad, indices, 1, t)) for bk in native_backends(device)
    }
    name = f"B{b} T{t} E{e} m{m} k{k}+1 bf16"
    return [
        (
            f"gather_tokens fwd {name}",
            nbytes(indices, grad, grad),
            {**forward, "torch": lambda: gather_tokens_reference(x, indices, 1)},
        ),
        (
            f"gather_tokens bwd {name}",
            nbytes(grad, indices, x),
            {**backward, "torch": lambda: gather_tokens_backward_reference(grad, indices, 1, t)},
        ),
    ]


def timing_specs(dry: bool) -> list[tuple[Callable[..., list[TimingCase]], tuple]]:
    """Each op at SOP's shapes (ViT-B/16: d = 196 on a 14 × 14 grid, BERT: 512): ``(case builder, its
    arguments before the device)`` (also the shapes bench/triton_compile_check.py compiles)."""
    rows = 8 if dry else TIMING_ROWS
    sparsemax_shapes = (
        [(16, 20), (8, 70)] if dry else [(TIMING_ROWS, 20), (TIMING_ROWS, 1000)]
    )  # dry: a few rows, interpreted
    specs: list[tuple[Callable[..., list[TimingCase]], tuple]] = [
        (sparsemax_timing_cases, shape) for shape in sparsemax_shapes
    ]
    for d, grid, blur, dtype in [
        (196, (14, 14), 3, torch.bfloat16),
        (196, (14, 14), 0, torch.float32),
        (512, None, 0, torch.bfloat16),
    ]:
        for ties_authors in (True, False):
            specs.append((top_tau_timing_cases, (rows, d, grid, blur, dtype, ties_authors)))
    specs.append((top_tau_backward_timing_cases, (rows,)))
    specs.append((gather_timing_cases, (1, 17, 8, 2, 3) if dry else (128, 197, 768, 20, 39)))  # 102,400 rows
    return specs


def timing_cases(device: torch.device, dry: bool) -> list[TimingCase]:
    """Every case of :func:`timing_specs`, on every backend and the reference."""
    return [case for build, args in timing_specs(dry) for case in build(*args, device)]


def sweep_points() -> list[tuple[str, dict[str, int]]]:
    """Every point of the launch-shape sweep: ``(op, {knob: value})``, each op's knobs crossed."""
    points = []
    for op, knobs in SWEEP_KNOBS.items():
        for values in itertools.product(*knobs.values()):
            points.append((op, dict(zip(knobs, values))))
    return points


@contextlib.contextmanager
def knobs_set(module: Any, settings: dict[str, int]) -> Iterator[None]:
    """``module``'s launch constants set to ``settings`` inside the block (an AttributeError for a name the
    module lacks), restored after."""
    saved = {name: getattr(module, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def timings_section(report: Report) -> None:
    device, dry = report.device, report.dry_run
    peak = peak_gbps(device)
    repeats = 1 if dry else 50
    report.row("timings", ["op", "impl", "ms", "GB/s", "% peak", "× torch"])
    report.row("timings", ["---", "---", "---:", "---:", "---:", "---:"])

    def run_cases() -> str:
        for name, moved, impls in timing_cases(device, dry):
            measured = {}
            for impl, fn in impls.items():
                try:
                    measured[impl] = time_ms(fn, device, repeats, warmup=0 if dry else 5)
                except Exception as error:  # keep the other implementations of this case
                    report.row("timings", [name, impl, f"error: {type(error).__name__}", "", "", ""])
            for impl, ms in measured.items():
                gbps = moved / ms / 1e6
                percent = f"{100 * gbps / peak:.1f}" if peak else "n/a"
                speedup = f"{measured['torch'] / ms:.2f}" if "torch" in measured else ""
                report.row("timings", [name, impl, f"{ms:.4f}", f"{gbps:.0f}", percent, speedup])
        return f"peak {peak or 'n/a'} GB/s"

    report.run("timings", "ops at SOP shapes", run_cases)
    if dry or "triton" not in native_backends(device):
        return
    import sop_kernels.sparsemax as triton_sparsemax
    import sop_kernels.top_tau as triton_top_tau

    def sweep() -> str:
        """Triton launch shapes: :data:`SWEEP_KNOBS`, one op's knobs crossed at a time."""
        best: dict[str, tuple[float, str]] = {}
        logits = torch.randn(TIMING_ROWS, 196, device=device)
        k = torch.full((TIMING_ROWS,), 39, device=device)
        x = torch.randn(65536, 20, device=device)
        modules = {"top_tau": triton_top_tau, "sparsemax": triton_sparsemax}
        cases = {
            "top_tau": (
                f"top_tau {TIMING_ROWS}x196 authors",
                lambda: kernel("top_tau_forward", "triton")(logits, k, 39, None, True, True, None, 0, 0),
            ),
            "sparsemax": ("sparsemax 65536x20", lambda: kernel("sparsemax_forward", "triton")(x)),
        }
        for op, settings in sweep_points():
            name, call = cases[op]
            shown = ", ".join(f"{knob} {value}" for knob, value in settings.items())
            with knobs_set(modules[op], settings):
                ms = time_ms(call, device, 30)
            report.row("triton launch shapes", [f"{name}: {shown}", f"{ms:.4f}"])
            best[op] = min(best.get(op, (math.inf, "")), (ms, shown))
        return "best: " + ", ".join(f"{op} {shown} ({ms:.4f} ms)" for op, (ms, shown) in best.items())

    report.tables.setdefault("triton launch shapes", ["| launch shape | ms |", "| --- | ---: |"])
    report.run("timings", "triton launch shapes", sweep)


# ----------------------------------------------------------------------------- 3. end to end


def vit_backbone(dry: bool):
    from transformers import ViTConfig, ViTForImageClassification

    if dry:
        cfg = ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=32,
            patch_size=8,
            num_labels=10,
        )
    else:  # ViT-B/16 at 224 (the config's defaults), 1000 classes
        cfg = ViTConfig(num_labels=1000)
    return ViTForImageClassification(cfg).eval()


def bert_backbone(dry: bool):
    from transformers import BertConfig, BertForSequenceClassification

    if dry:
        cfg = BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            num_labels=2,
        )
    else:  # BERT-base
        cfg = BertConfig(num_labels=2)
    return BertForSequenceClassification(cfg).eval()


def model_inputs(kind: str, batch: int, dry: bool, device: torch.device) -> tuple:
    gen = torch.Generator().manual_seed(0)
    if kind == "vit":
        size = 32 if dry else 224
        return (torch.randn(batch, 3, size, size, generator=gen).to(device),)
    length = 48 if dry else 512
    ids = torch.randint(5, 100 if dry else 20000, (batch, length), generator=gen)
    return ids.to(device), torch.ones_like(ids).to(device), torch.zeros_like(ids).to(device)


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


E2E_WARMUP, E2E_REPEATS = 3, 10


def end_to_end_cases(dry: bool) -> list[tuple[str, int, bool]]:
    """``(backbone, batch, training step)`` in the order they run: the headline numbers first."""
    if dry:
        return [("vit", 2, False), ("vit", 2, True), ("bert", 1, False), ("bert", 1, True)]
    return [
        ("vit", 64, False),
        ("vit", 16, True),
        ("bert", 16, False),
        ("bert", 4, True),
        ("vit", 128, False),
        ("vit", 32, True),
    ]


def _call_ms(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def interleaved_ms(
    fns: dict[str, Callable[[], object]], device: torch.device, warmup: int, repeats: int
) -> dict[str, tuple[list[float], float | None, str]]:
    """Each function's milliseconds per call over ``repeats`` rounds, the functions taking turns, after
    ``warmup`` rounds; its ``max_memory_allocated`` in MiB during its last call (weights and inputs
    included; ``None`` on the CPU); and an error (``"OOM"``, …) that took it out of the rounds."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    peaks: dict[str, float | None] = dict.fromkeys(fns)
    errors: dict[str, str] = dict.fromkeys(fns, "")
    for round_ in range(warmup + repeats):
        for name, fn in fns.items():
            if errors[name]:
                continue
            last = round_ == warmup + repeats - 1
            try:
                if last and device.type == "cuda":
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                ms = _call_ms(fn, device)
                if last and device.type == "cuda":
                    peaks[name] = torch.cuda.max_memory_allocated(device) / 2**20
            except torch.OutOfMemoryError:
                errors[name] = "OOM"
            except RuntimeError as error:
                errors[name] = f"{type(error).__name__}: {str(error)[:120]}"
            if errors[name] and device.type == "cuda":
                torch.cuda.empty_cache()
            if not errors[name] and round_ >= warmup:
                times[name].append(ms)
    return {name: (times[name], peaks[name], errors[name]) for name in fns}


def model_label(kind: str, dry: bool) -> str:
    """The report's name for the ``kind`` ("vit" or "bert") model: the tiny one in a dry run."""
    return f"tiny {kind}" if dry else ("ViT-B/16 224" if kind == "vit" else "BERT-base 512")


def end_to_end_section(report: Report) -> None:
    """Reference (the authors' algorithm), exact and drop interleaved in one process, bf16 autocast;
    drop also on the other backends."""
    device, dry = report.device, report.dry_run
    report.row(
        "end to end",
        [
            "model",
            "step",
            "batch",
            "variant",
            "backend",
            "median ms",
            "min ms",
            "max ms",
            "samples/s",
            "× reference",
            "peak MiB",
        ],
    )
    report.row("end to end", ["---", "---", "---:", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:"])
    models: dict[str, sopfast.SOP] = {}

    def model_for(kind: str) -> sopfast.SOP:
        if kind not in models:
            models[kind] = build_model(kind, dry, device)
        return models[kind]

    for kind, batch, train in end_to_end_cases(dry):
        step = "train step" if train else "forward"

        def run(kind=kind, batch=batch, train=train, step=step) -> str:
            model = model_for(kind)
            model.train(train)
            args = model_inputs(kind, batch, dry, device)
            labels = torch.zeros(batch, dtype=torch.long, device=device)
            default = _backends.backends()[device.type]
            variants: dict[str, Callable[[], object]] = {}
            for backend in [default] + [b for b in (*native_backends(device), "torch") if b != default]:
                fns = step_functions(model, args, labels, train)
                names = fns if backend == default else ["drop"]
                for name in names:
                    fn = fns[name]

                    def call(fn=fn, backend=backend) -> object:
                        with forced_backend(backend), autocast(device):
                            return fn()

                    variants[f"{name}/{backend}"] = call
            measured = interleaved_ms(variants, device, 1 if dry else E2E_WARMUP, 1 if dry else E2E_REPEATS)
            reference = measured[f"reference/{default}"][0]
            reference_ms = statistics.median(reference) if reference else math.nan
            for key, (times, peak, error) in measured.items():
                name, backend = key.split("/")
                if error:
                    cells = [error, "", "", "", "", ""]
                else:
                    ms = statistics.median(times)
                    cells = [f"{ms:.1f}", f"{min(times):.1f}", f"{max(times):.1f}", f"{batch / ms * 1e3:.0f}"]
                    cells += [f"{reference_ms / ms:.2f}", "" if peak is None else f"{peak:.0f}"]
                report.row("end to end", [model_label(kind, dry), step, batch, name, backend, *cells])
            return ", ".join(
                f"{key} {statistics.median(t):.1f} ms" if t else f"{key} {e}" for key, (t, _, e) in measured.items()
            )

        report.run("end to end", f"{kind} {step} batch {batch}", run)


# ----------------------------------------------------------------------------- gates: one answer on every device

PARITY_RTOL = 1e-4  # fp32, TF32 off: exact's logits against the authors' algorithm, relative to the largest
CALIBRATION_FACTOR = 1.5  # bf16: exact's error may be at most this times the authors' algorithm's own


def build_model(kind: str, dry: bool, device: torch.device, **options: Any) -> sopfast.SOP:
    """The SOP of the end-to-end runs (recipe "paper": the authors' algorithm), seeded; ``options`` go to
    ``sopfast.SOP`` (``backbone_dtype``, ``compile``)."""
    torch.manual_seed(0)
    backbone = vit_backbone(dry) if kind == "vit" else bert_backbone(dry)
    return sopfast.SOP(backbone, num_groups=20, tau=0.2, recipe="paper", **options).to(device).eval()


def logit_errors(out, truth) -> torch.Tensor:
    """``[B]``: each example's largest |Δ logit| over its largest |true logit|."""
    scale = truth.logits.float().abs().amax(-1).clamp_min(1e-12)
    return (out.logits.float() - truth.logits.float()).abs().amax(-1) / scale


def mask_mismatch(out, truth) -> float:
    """The fraction of group-mask cells that differ."""
    return (out.group_masks != truth.group_masks).float().mean().item()


def gate_batch(kind: str, dry: bool) -> int:
    return 4 if dry else (16 if kind == "vit" else 8)


def parity_fp32(report: Report, kind: str) -> None:
    """fp32, TF32 off: exact equals the authors' algorithm — masks identical, logits within PARITY_RTOL."""

    def run() -> str:
        model = build_model(kind, report.dry_run, report.device)
        args = model_inputs(kind, gate_batch(kind, report.dry_run), report.dry_run, report.device)
        with torch.no_grad():
            truth = reference_forward(model, *args)
            exact = model(*args, mode="exact")
        cells = mask_mismatch(exact, truth)
        error = logit_errors(exact, truth).max().item()
        report.row("gates", [model_label(kind, report.dry_run), "fp32 parity", f"{cells:.2e}", f"{error:.2e}", ""])
        assert cells == 0, f"exact's masks differ from the authors' algorithm in {cells:.2e} of the cells"
        assert error <= PARITY_RTOL, f"exact's logits differ by {error:.2e} (relative) > {PARITY_RTOL:.0e}"
        return f"masks identical, logits {error:.1e} relative"

    report.run("gates", f"{kind} fp32 parity (TF32 off)", run)


def calibration_bf16(report: Report, kind: str) -> None:
    """bf16 autocast against the fp32 authors' algorithm: exact's mask mismatch and p95 logit error each at
    most CALIBRATION_FACTOR times the authors' algorithm's own in bf16.  A NaN anywhere fails."""

    def run() -> str:
        model = build_model(kind, report.dry_run, report.device)
        args = model_inputs(kind, gate_batch(kind, report.dry_run), report.dry_run, report.device)
        with torch.no_grad():
            truth = reference_forward(model, *args)
            with autocast(report.device):
                measured = {"authors bf16": reference_forward(model, *args), "exact bf16": model(*args, mode="exact")}
        stats = {}
        for name, out in measured.items():
            errors = logit_errors(out, truth)
            stats[name] = (mask_mismatch(out, truth), torch.quantile(errors.double(), 0.95).item())
            cells, p95 = stats[name]
            report.row("gates", [model_label(kind, report.dry_run), name, f"{cells:.2e}", "", f"{p95:.2e}"])
        (ref_cells, ref_p95), (cells, p95) = stats["authors bf16"], stats["exact bf16"]
        values = [ref_cells, ref_p95, cells, p95]
        assert all(math.isfinite(v) for v in values), f"not finite: {values}"
        assert cells <= CALIBRATION_FACTOR * ref_cells, (
            f"exact's mask mismatch {cells:.2e} > {CALIBRATION_FACTOR} × the authors' {ref_cells:.2e}"
        )
        assert p95 <= CALIBRATION_FACTOR * ref_p95, (
            f"exact's p95 logit error {p95:.2e} > {CALIBRATION_FACTOR} × the authors' {ref_p95:.2e}"
        )
        return f"masks {cells:.2e} vs {ref_cells:.2e}, p95 logits {p95:.2e} vs {ref_p95:.2e}"

    report.run("gates", f"{kind} bf16 calibrated against the authors' bf16", run)


def gates_section(report: Report) -> None:
    """fp32 parity and the bf16 calibration, ViT then BERT."""
    report.row("gates", ["model", "variant", "mask cells ≠ fp32 authors", "max logit error", "p95 logit error"])
    report.row("gates", ["---", "---", "---:", "---:", "---:"])
    for kind in ("vit", "bert"):
        parity_fp32(report, kind)
        calibration_bf16(report, kind)


# ----------------------------------------------------------------------------- 4. CPU = CUDA


def agreement_section(report: Report) -> None:
    """The same SOP weights on the CPU (C++ kernels) and on the device (each native backend), fp32."""
    device, dry = report.device, report.dry_run
    for kind in ("vit", "bert"):

        def run(kind=kind) -> str:
            torch.manual_seed(0)
            backbone = vit_backbone(dry) if kind == "vit" else bert_backbone(dry)
            cpu_model = sopfast.SOP(backbone, num_groups=20, tau=0.2, recipe="paper").eval()
            args = model_inputs(kind, 2, dry, torch.device("cpu"))
            details = []
            with torch.no_grad(), forced_backend("cpp" if _backends.has_cpp() else "torch"):
                expected = {mode: cpu_model(*args, mode=mode) for mode in cpu_model.adapter.supported_modes}
            model = copy.deepcopy(cpu_model).to(device)
            for backend in native_backends(device):
                for mode, out_cpu in expected.items():
                    with torch.no_grad(), forced_backend(backend):
                        out = model(*(a.to(device) for a in args), mode=mode)
                    assert torch.equal(out.group_masks.cpu(), out_cpu.group_masks), f"{backend} {mode}: groups differ"
                    diff = max_diff(out.logits.float().cpu(), out_cpu.logits.float())
                    assert diff <= 1e-3, f"{backend} {mode}: logits differ by {diff:.1e}"
                    details.append(f"{backend}/{mode} {diff:.1e}")
            return "groups identical; logits " + ", ".join(details)

        report.run("cpu = device", f"{kind} same weights, fp32", run)


# ----------------------------------------------------------------------------- main


def write_markdown(report: Report, path: Path, started: float) -> None:
    device = report.device
    card = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or 'x86-64'}, dry run)"
    )
    lines = [
        f"# sopfast GPU report — {card}",
        "",
        f"Generated by `bench/gpu_report.py{' --dry-run' if report.dry_run else ''}` "
        f"in {time.monotonic() - started:.0f} s: torch {torch.__version__}, triton {_triton_version()}, "
        f"backends {_backends.backends()['available']}.",
        f"Peak memory bandwidth used for %: {peak_gbps(device) or 'n/a'} GB/s.",
        *report.environment,
        "",
        "## Checks",
        "",
        *checks_and_tables(report, "section"),
    ]
    path.write_text("\n".join(lines))


def checks_and_tables(report: Report, heading: str) -> list[str]:
    """Markdown lines: the checks (``heading`` names their first column), the summary line, the tables."""
    lines = [f"| {heading} | check | status | detail | s |", "| --- | --- | --- | --- | ---: |"]
    lines += [f"| {c.section} | {c.name} | {c.status} | {c.detail} | {c.seconds:.1f} |" for c in report.checks]
    counts = {s: sum(c.status == s for c in report.checks) for s in ("ok", "FAIL", "error", "skipped")}
    lines += ["", "Summary: " + ", ".join(f"{n} {s}" for s, n in counts.items()), ""]
    for title, rows in report.tables.items():
        lines += [f"## {title}", "", *rows, ""]
    return lines


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "n/a"


def environment(device: torch.device) -> list[str]:
    """The card, its clocks and the software versions, as Markdown lines."""
    lines = [
        f"Python {platform.python_version()}, CUDA {torch.version.cuda}, transformers {_version_of('transformers')}."
    ]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        lines.append(f"{props.name}: {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB.")
        query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"
        try:
            smi = subprocess.run(
                ["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True, timeout=20
            )
            lines.append(f"nvidia-smi: `{' / '.join(smi.stdout.strip().splitlines())}`.")
        except (OSError, subprocess.SubprocessError) as error:
            lines.append(f"nvidia-smi failed: {error}.")
    return lines


def _version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU through the same code paths")
    parser.add_argument("--output", type=Path, default=Path(__file__).with_name("RESULTS_gpu.md"))
    parser.add_argument(
        "--sections", default=",".join(SECTION_BUDGET_S), help=f"comma-separated subset of {list(SECTION_BUDGET_S)}"
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_report: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    sections = {
        "e2e": end_to_end_section,
        "gates": gates_section,
        "agreement": agreement_section,
        "ops": ops_section,
        "timings": timings_section,
    }
    chosen = [name.strip() for name in args.sections.split(",")]
    unknown = [name for name in chosen if name not in sections]
    if unknown:
        print(f"gpu_report: --sections {unknown} unknown; allowed: {list(sections)}", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    started = time.monotonic()
    report = Report(device, args.dry_run, started + TIME_BUDGET_S, output=args.output, started=started)
    report.environment = environment(device)
    for name in chosen:
        report.begin(name, SECTION_BUDGET_S[name])
        sections[name](report)
        report.write()
    print(f"gpu_report: wrote {args.output}")
    return 0 if all(c.status in ("ok", "skipped") for c in report.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
