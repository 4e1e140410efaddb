"""Time each ``sop_kernels`` Triton kernel against its PyTorch reference on a CUDA GPU.

Prints a markdown table (ms, achieved GB/s, % of the card's peak memory bandwidth, speed-up, and
the largest difference from the reference, so a run doubles as a correctness check at full
size).  Sparsemax is also timed against ``entmax`` when it is importable.  Non-interactive; a run
takes well under two minutes::

    PYTHONPATH=.:python python bench/gpu_ops_report.py [--peak-gbps 4800] [--dtypes fp32,bf16]

GB/s counts the bytes an ideal kernel must move (each input read once, each output written once).
The peak defaults to 4800 GB/s on an H200 and 3350 GB/s on an H100 (detected by name).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from triton.testing import do_bench

import sop_kernels
from sopfast.ops import (
    gather_tokens_backward_reference,
    gather_tokens_reference,
    gaussian_kernel1d,
    sparsemax_backward_reference,
    sparsemax_reference,
    top_tau_backward_reference,
    top_tau_reference,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PEAK_GBPS_BY_NAME = {"H200": 4800.0, "H100": 3350.0}
TOP_TAU_ROWS = 4096
GATHER_SHAPE = dict(b=64, t=197, e=768, m=20, k=39, prefix=1)


@dataclass
class Case:
    """One timed operation: the Triton call, its reference, optionally entmax, and the ideal traffic.
    ``check`` gives the ``(triton, reference)`` outputs to compare, when not those of the two calls."""

    name: str
    dtype: torch.dtype
    bytes_moved: int
    triton: Callable[[], object]
    reference: Callable[[], object]
    entmax: Callable[[], object] | None = None
    check: Callable[[], tuple[object, object]] | None = None


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _entmax_sparsemax() -> Callable | None:
    try:
        from entmax import sparsemax
    except ImportError:
        return None
    return sparsemax


def sparsemax_case(n_rows: int, n: int, dtype: torch.dtype, backward: bool) -> Case:
    """Sparsemax forward (or forward + backward) over ``[n_rows, n]``."""
    x = torch.randn(n_rows, n, device="cuda", dtype=dtype) * 2
    grad = torch.randn_like(x)
    entmax_sparsemax = _entmax_sparsemax()
    if not backward:
        return Case(
            f"sparsemax fwd {n_rows}x{n}",
            dtype,
            2 * _nbytes(x),
            lambda: sop_kernels.sparsemax_forward(x),
            lambda: sparsemax_reference(x),
            None if entmax_sparsemax is None else (lambda: entmax_sparsemax(x, dim=-1)),
        )
    x_grad = x.detach().requires_grad_(True)
    p = sparsemax_reference(x)
    return Case(
        f"sparsemax fwd+bwd {n_rows}x{n}",
        dtype,
        5 * _nbytes(x),
        lambda: sop_kernels.sparsemax_backward(sop_kernels.sparsemax_forward(x), grad),
        lambda: sparsemax_backward_reference(sparsemax_reference(x), grad),
        None if entmax_sparsemax is None else (lambda: torch.autograd.grad(entmax_sparsemax(x_grad), x_grad, grad)[0]),
        # the backward on the same p: an entry within rounding of the support's edge may leave it in one p only
        check=lambda: (sop_kernels.sparsemax_backward(p, grad), sparsemax_backward_reference(p, grad)),
    )


def _top_tau_inputs(d: int, dtype: torch.dtype, with_blur: bool, grid: tuple[int, int]) -> tuple:
    logits = torch.randn(TOP_TAU_ROWS, d, device="cuda", dtype=dtype)
    k_max = max(1, d // 5)
    k = torch.full((TOP_TAU_ROWS,), k_max, device="cuda", dtype=torch.int64)
    blur = gaussian_kernel1d(5, 1.0, "cuda") if with_blur else None
    return logits, k, k_max, None, True, False, blur, *grid


def top_tau_case(d: int, grid: tuple[int, int], with_blur: bool, dtype: torch.dtype) -> Case:
    """Top-τ forward (k = d // 5) on ``[4096, d]``, optionally with a 5-tap blur on ``grid`` (or 1-D)."""
    args = _top_tau_inputs(d, dtype, with_blur, grid)
    logits, k, k_max = args[:3]
    moved = _nbytes(logits, k) + logits.numel() * (4 + 1) + TOP_TAU_ROWS * (8 * k_max + 4)
    name = f"top_tau fwd {TOP_TAU_ROWS}x{d}" + (f" blur5 {'2-D' if grid[0] else '1-D'}" if with_blur else "")

    def reference():
        with torch.no_grad():
            return top_tau_reference(*args)

    return Case(name, dtype, moved, lambda: sop_kernels.top_tau_forward(*args), reference)


def top_tau_backward_case(d: int, grid: tuple[int, int]) -> Case:
    """Top-τ backward through the 5-tap blur's adjoint (attention is fp32 whatever the logits' dtype)."""
    forward_args = _top_tau_inputs(d, torch.float32, True, grid)
    _, mask, lam, attention = top_tau_reference(*forward_args)
    grad_lam, grad_attention = torch.randn_like(lam), torch.randn_like(attention)
    args = (attention, mask, lam, grad_lam, grad_attention, *forward_args[-3:])
    return Case(
        f"top_tau bwd {TOP_TAU_ROWS}x{d} blur5",
        torch.float32,
        _nbytes(attention, mask, lam, grad_lam, grad_attention, attention),
        lambda: sop_kernels.top_tau_backward(*args),
        lambda: top_tau_backward_reference(*args),
    )


def gather_tokens_case(dtype: torch.dtype, backward: bool) -> Case:
    """ViT-B/16 token gather (B=64, T=197, E=768, m=20 groups of k=39 tokens + CLS), or its scatter-add."""
    b, t, e, m, k, prefix = (GATHER_SHAPE[key] for key in ("b", "t", "e", "m", "k", "prefix"))
    x = torch.randn(b, t, e, device="cuda", dtype=dtype)
    scores = torch.rand(b, m, t - prefix, device="cuda")
    indices = scores.topk(k, dim=-1).indices.sort(dim=-1).values + prefix
    grad = torch.randn(b * m, prefix + k, e, device="cuda", dtype=dtype)
    name = f"gather_tokens {'bwd' if backward else 'fwd'} B{b} T{t} E{e} m{m} k{k}+{prefix}"
    if backward:
        return Case(
            name,
            dtype,
            _nbytes(grad, indices, x),
            lambda: sop_kernels.gather_tokens_backward(grad, indices, prefix, t),
            lambda: gather_tokens_backward_reference(grad, indices, prefix, t),
        )
    return Case(
        name,
        dtype,
        _nbytes(x, indices, grad),
        lambda: sop_kernels.gather_tokens_forward(x, indices, prefix),
        lambda: gather_tokens_reference(x, indices, prefix),
    )


def case_specs(dtype_names: list[str]) -> list[tuple[str, Callable[[], Case]]]:
    """``(id, build)`` for every case; ``build`` allocates the CUDA inputs only when called."""
    specs = []
    for name in dtype_names:
        dtype = DTYPES[name]
        for n_rows, n in ((65536, 20), (8192, 1000)):
            specs.append((f"sparsemax-fwd-{n_rows}x{n}-{name}", partial(sparsemax_case, n_rows, n, dtype, False)))
            specs.append((f"sparsemax-fwd+bwd-{n_rows}x{n}-{name}", partial(sparsemax_case, n_rows, n, dtype, True)))
        for d, grid, with_blur in ((196, (14, 14), False), (196, (14, 14), True), (512, (0, 0), False)):
            case_id = f"top_tau-fwd-{d}{'-blur' if with_blur else ''}-{name}"
            specs.append((case_id, partial(top_tau_case, d, grid, with_blur, dtype)))
        specs.append((f"gather_tokens-fwd-{name}", partial(gather_tokens_case, dtype, False)))
        specs.append((f"gather_tokens-bwd-{name}", partial(gather_tokens_case, dtype, True)))
    specs.append(("top_tau-bwd-196-blur-fp32", partial(top_tau_backward_case, 196, (14, 14))))
    return specs


def describe_difference(actual: object, expected: object) -> str:
    """Largest |difference| of the float outputs, plus the count of mismatching integer/bool entries."""
    pairs = zip(actual, expected, strict=True) if isinstance(actual, tuple) else [(actual, expected)]
    largest, mismatches = 0.0, 0
    for a, e in pairs:
        if a.is_floating_point():
            largest = max(largest, (a.double() - e.double()).abs().nan_to_num(nan=0.0).max().item())
        else:
            mismatches += int((a != e).sum())
    return f"{largest:.1e}" + (f", {mismatches} int/bool ≠" if mismatches else "")


def time_ms(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def default_peak_gbps() -> float | None:
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_GBPS_BY_NAME.items() if key in name), None)


def report_rows(case: Case, peak_gbps: float | None) -> list[str]:
    """Markdown rows for one case: Triton first, then the reference and entmax, each with its speed-up."""
    difference = describe_difference(*(case.check() if case.check else (case.triton(), case.reference())))
    timings = [("triton", time_ms(case.triton)), ("torch ref", time_ms(case.reference))]
    if case.entmax is not None:
        try:
            timings.append(("entmax", time_ms(case.entmax)))
        except Exception as error:  # entmax is only a point of comparison
            print(f"entmax failed on {case.name} ({case.dtype}): {error}", file=sys.stderr)
    triton_ms = timings[0][1]
    dtype = str(case.dtype).removeprefix("torch.")
    rows = []
    for impl, ms in timings:
        gbps = case.bytes_moved / ms / 1e6
        peak = f"{100 * gbps / peak_gbps:.1f}" if peak_gbps else "n/a"
        diff = difference if impl == "triton" else ""
        rows.append(
            f"| {case.name} | {dtype} | {impl} | {ms:.4f} | {gbps:.0f} | {peak} | {ms / triton_ms:.2f}x | {diff} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peak-gbps", type=float, default=None, help="peak memory bandwidth (default: by GPU name)")
    parser.add_argument("--dtypes", default="fp32,bf16", help=f"comma-separated, from {sorted(DTYPES)}")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_ops_report: no CUDA device; nothing to time", file=sys.stderr)
        return 1
    peak = args.peak_gbps or default_peak_gbps()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, peak {peak or 'unknown'} GB/s, torch {torch.__version__}\n")
    print("| op | dtype | impl | ms | GB/s | % peak | time / triton | max abs diff vs ref |")
    print("|---|---|---|---|---|---|---|---|")
    failures = 0
    for case_id, build in case_specs([name.strip() for name in args.dtypes.split(",")]):
        try:
            rows = report_rows(build(), peak)
        except Exception as error:  # keep going: one broken case must not hide the others
            failures += 1
            rows = [f"| {case_id} | | FAILED | {type(error).__name__}: {str(error)[:200]} | | | | |"]
        print("\n".join(rows), flush=True)
        torch.cuda.empty_cache()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
