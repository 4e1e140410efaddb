"""Compile every Triton kernel shape that bench/gpu_report.py and bench/gpu_ops_report.py launch, for
an H100 (sm_90) with Triton's own compiler — no GPU needed — and report per shape the compile time,
registers, spills, stack and shared memory::

    PYTHONPATH=.:python python bench/triton_compile_check.py [--output bench/RESULTS_triton_compile.md]

The shapes come from the reports' own lists (``gpu_report.ops_checks`` and ``timing_specs``, its
launch-shape sweep, ``gpu_ops_report.case_specs``): each entry runs the ``sop_kernels`` wrapper its
report calls, on meta tensors of the same shapes and dtypes, with ``JITFunction.run`` replaced by a
recorder — so every constexpr, ``num_warps`` and argument specialisation is the one a real launch
binds.  Each distinct kernel variant is compiled once, in a child process with a fresh cache (and a
time limit); ``ptxas -v`` on its PTX gives registers, spills and stack.  Exits 1 when a hot kernel
(any but the tiled long-row kernels, which stream their rows) spills, or a compile takes more than
``MAX_SECONDS``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret (gpu_report sets 1 without a GPU)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_ops_report
import gpu_report
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

import sop_kernels
import sop_kernels.sparsemax as triton_sparsemax
import sop_kernels.top_tau as triton_top_tau
from sopfast.ops import gaussian_kernel1d
from sopfast.ops.blur import blur_adjoint_reference, blur_reference

MAX_SECONDS = 20.0  # per compile; a child still running at LIMIT_SECONDS is stopped
LIMIT_SECONDS = 120.0
TARGET = GPUTarget("cuda", 90, 32)
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
META = torch.device("meta")
# long blurred rows blur with sopfast's torch ops, which sopfast hands the kernels when it loads them itself
triton_top_tau.use_torch_blur(blur_reference, blur_adjoint_reference)


# ----------------------------------------------------------------------------- the launches of the reports


@dataclass
class Launch:
    kernel: JITFunction
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def recorded_launches() -> Iterator[list[Launch]]:
    """Triton launches inside the block are recorded, not run."""
    launches: list[Launch] = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        launches.append(Launch(self, args, kwargs))

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


def empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=META)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def sparsemax_calls(rows: int, n: int, dtype: torch.dtype, backward: bool = True) -> None:
    x = empty(rows, n, dtype=dtype)
    sop_kernels.sparsemax_forward(x)
    if backward:
        sop_kernels.sparsemax_backward(empty(rows, n, dtype=dtype), empty(rows, n, dtype=dtype))


def top_tau_calls(
    rows: int,
    d: int,
    grid: tuple[int, int] | None,
    dtype: torch.dtype,
    ties_authors: bool,
    largest: bool = True,
    with_valid: bool = False,
    blur: int = 0,
    forward: bool = True,
    backward: bool = True,
) -> None:
    """The forward and backward of top_tau as the reports call them (``grid`` only with a blur)."""
    compute = compute_dtype(dtype)
    kernel = gaussian_kernel1d(blur, 1.0, META).to(compute) if blur else None
    grid_h, grid_w = grid if (grid and blur) else (0, 0)
    k = empty(rows, dtype=torch.int64)
    valid = empty(rows, d, dtype=torch.bool) if with_valid else None
    if forward:
        logits = empty(rows, d, dtype=dtype)
        sop_kernels.top_tau_forward(logits, k, max(1, d // 5), valid, largest, ties_authors, kernel, grid_h, grid_w)
    if backward:
        attention, lam = empty(rows, d, dtype=compute), empty(rows, dtype=compute)
        mask = empty(rows, d, dtype=torch.bool)
        sop_kernels.top_tau_backward(attention, mask, lam, lam, attention, kernel, grid_h, grid_w)


def gather_calls(b: int, t: int, e: int, m: int, k: int, prefix: int, dtype: torch.dtype, backward: bool) -> None:
    indices = empty(b, m, k, dtype=torch.int64)
    sop_kernels.gather_tokens_forward(empty(b, t, e, dtype=dtype), indices, prefix)
    if backward:
        sop_kernels.gather_tokens_backward(empty(b * m, prefix + k, e, dtype=dtype), indices, prefix, t)


# report entry (check, case builder) -> the Triton calls it makes, from the entry's arguments
REPORT_CALLS: dict[Callable, Callable[..., None]] = {
    gpu_report.check_sparsemax: lambda n, dtype, rows: sparsemax_calls(rows, n, dtype),
    gpu_report.check_top_tau: lambda d, grid, dtype, ties_authors, largest, with_valid, blur: top_tau_calls(
        gpu_report.TOP_TAU_CHECK_ROWS, d, grid, dtype, ties_authors, largest, with_valid, blur
    ),
    gpu_report.check_gather: lambda b, t, e, m, k, prefix, dtype: gather_calls(b, t, e, m, k, prefix, dtype, True),
    gpu_report.check_huge_gather: lambda b, t, e, m, k, prefix, backward: gather_calls(
        b, t, e, m, k, prefix, torch.bfloat16, backward
    ),
    gpu_report.sparsemax_timing_cases: lambda rows, n: sparsemax_calls(rows, n, torch.float32),
    gpu_report.top_tau_timing_cases: lambda rows, d, grid, blur, dtype, ties_authors: top_tau_calls(
        rows, d, grid, dtype, ties_authors, blur=blur, backward=False
    ),
    gpu_report.top_tau_backward_timing_cases: lambda rows: top_tau_calls(
        rows, 196, (14, 14), torch.float32, False, blur=3, forward=False
    ),
    gpu_report.gather_timing_cases: lambda b, t, e, m, k: gather_calls(b, t, e, m, k, 1, torch.bfloat16, True),
    gpu_ops_report.sparsemax_case: lambda rows, n, dtype, backward: sparsemax_calls(rows, n, dtype, backward),
    gpu_ops_report.top_tau_case: lambda d, grid, with_blur, dtype: top_tau_calls(
        gpu_ops_report.TOP_TAU_ROWS, d, grid, dtype, False, blur=5 if with_blur else 0, backward=False
    ),
    gpu_ops_report.top_tau_backward_case: lambda d, grid: top_tau_calls(
        gpu_ops_report.TOP_TAU_ROWS, d, grid, torch.float32, False, blur=5, forward=False
    ),
    gpu_ops_report.gather_tokens_case: lambda dtype, backward: gather_calls(
        *(gpu_ops_report.GATHER_SHAPE[key] for key in ("b", "t", "e", "m", "k", "prefix")), dtype, backward
    ),
}


def sweep_calls(op: str, settings: dict[str, int]) -> None:
    """One point of gpu_report's Triton launch-shape sweep (top_tau 4096 × 196 authors, sparsemax 65536 × 20)."""
    module = {"top_tau": triton_top_tau, "sparsemax": triton_sparsemax}[op]
    with gpu_report.knobs_set(module, settings):
        if op == "top_tau":
            top_tau_calls(4096, 196, None, torch.float32, True, backward=False)
        else:
            sparsemax_calls(65536, 20, torch.float32, backward=False)


def report_entries() -> Iterator[tuple[str, Callable[[], None]]]:
    """``(label, calls)`` for every entry of the two reports."""
    for check, args in gpu_report.ops_checks(dry=False):
        yield f"gpu_report ops {check.__name__}{args}", lambda check=check, args=args: REPORT_CALLS[check](*args)
    for build, args in gpu_report.timing_specs(dry=False):
        yield f"gpu_report timings {build.__name__}{args}", lambda build=build, args=args: REPORT_CALLS[build](*args)
    for op, settings in gpu_report.sweep_points():
        yield f"gpu_report sweep {op} {settings}", lambda op=op, settings=settings: sweep_calls(op, settings)
    for case_id, build in gpu_ops_report.case_specs(["fp32", "bf16"]):
        yield f"gpu_ops_report {case_id}", lambda build=build: REPORT_CALLS[build.func](*build.args)


# ----------------------------------------------------------------------------- compiling


@dataclass
class Variant:
    """One distinct compile of a kernel: what a launch binds."""

    kernel: JITFunction
    signature: dict
    constexprs: dict
    attrs: dict
    options: object
    used_by: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    @property
    def hot(self) -> bool:
        return "_tiled_" not in self.name

    def describe(self) -> str:
        names = [p.name for p in self.kernel.params]
        consts = {names[path[0]]: value for path, value in self.constexprs.items()}
        shown = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in consts.items() if not k.endswith("_ptr"))
        pointers = sorted({v for v in self.signature.values() if v.startswith("*")})
        wide = [k for k, v in self.signature.items() if v == "i64"]
        return (
            f"{shown}; warps={self.options.num_warps}; {'/'.join(pointers)}{'; i64 ' + ','.join(wide) if wide else ''}"
        )


def variant_of(launch: Launch, backend) -> Variant:
    kernel, kwargs = launch.kernel, dict(launch.kwargs)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return Variant(kernel, signature, constexprs, attrs, options)


def variant_key(variant: Variant) -> str:
    return repr((variant.name, variant.signature, variant.constexprs, variant.attrs, variant.options.num_warps))


def collect_variants() -> list[Variant]:
    backend = make_backend(TARGET)
    variants: dict[str, Variant] = {}
    for label, calls in report_entries():
        with recorded_launches() as launches:
            calls()
        for launch in launches:
            variant = variant_of(launch, backend)
            variants.setdefault(variant_key(variant), variant).used_by.append(label)
    return list(variants.values())


@dataclass
class Compiled:
    seconds: float = 0.0
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    shared: int = 0
    error: str = ""


def ptxas_usage(ptx: str) -> dict[str, int]:
    """Registers, spill bytes and stack of the PTX's kernel, from ``ptxas -v`` for sm_90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        log = subprocess.run(
            [str(PTXAS), "-v", "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True, check=True
        ).stderr
    numbers = {
        "stack": r"(\d+) bytes stack frame",
        "spill_stores": r"(\d+) bytes spill stores",
        "spill_loads": r"(\d+) bytes spill loads",
        "registers": r"Used (\d+) registers",
    }
    return {key: int(re.search(pattern, log).group(1)) for key, pattern in numbers.items()}


def compile_in_child(variant: Variant, connection) -> None:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        source = ASTSource(variant.kernel, variant.signature, variant.constexprs, variant.attrs)
        start = time.perf_counter()
        kernel = triton.compile(source, target=TARGET, options=variant.options.__dict__)
        seconds = time.perf_counter() - start
        connection.send(Compiled(seconds=seconds, shared=kernel.metadata.shared, **ptxas_usage(kernel.asm["ptx"])))


def compile_variant(variant: Variant) -> Compiled:
    """Compile in a forked child (fresh cache, stopped after LIMIT_SECONDS)."""
    receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=compile_in_child, args=(variant, sender))
    start = time.perf_counter()
    child.start()
    if receiver.poll(LIMIT_SECONDS):
        result = receiver.recv()
    else:
        result = Compiled(seconds=time.perf_counter() - start, error=f"not done after {LIMIT_SECONDS:.0f} s")
    child.kill()
    child.join()
    if child.exitcode not in (0, -9) and not result.error and not result.registers:
        result.error = f"compile failed (exit {child.exitcode})"
    return result


def problems(variant: Variant, result: Compiled) -> list[str]:
    found = [result.error] if result.error else []
    if result.seconds > MAX_SECONDS:
        found.append(f"compile {result.seconds:.1f} s > {MAX_SECONDS:.0f} s")
    if variant.hot and (result.spill_stores or result.spill_loads):
        found.append("spills in a hot kernel")
    return found


def table(rows: list[tuple[Variant, Compiled]]) -> list[str]:
    lines = [
        "| kernel | variant (constexprs; warps; pointers) | compile s | registers | spill st/ld B | stack B "
        "| shared B | launched by | status |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for variant, result in rows:
        status = "; ".join(problems(variant, result)) or "ok"
        uses = f"{variant.used_by[0]} (+{len(variant.used_by) - 1})" if len(variant.used_by) > 1 else variant.used_by[0]
        lines.append(
            f"| {variant.name}{'' if variant.hot else ' (tiled)'} | {variant.describe()} | {result.seconds:.1f} "
            f"| {result.registers} | {result.spill_stores}/{result.spill_loads} | {result.stack} | {result.shared} "
            f"| {uses} | {status} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, help="also write the table as markdown here")
    parser.add_argument("--only", default="", help="compile only the variants whose name and constexprs match this")
    args = parser.parse_args(argv)
    started = time.monotonic()
    variants = [v for v in collect_variants() if re.search(args.only, f"{v.name} {v.describe()}")]
    print(f"{len(variants)} kernel variants from the launches of bench/gpu_report.py and bench/gpu_ops_report.py")
    rows = []
    for variant in variants:
        result = compile_variant(variant)
        rows.append((variant, result))
        print(
            f"{variant.name} [{variant.describe()}]: {result.seconds:.1f} s, {result.registers} registers, "
            f"spills {result.spill_stores}/{result.spill_loads} B {'; '.join(problems(variant, result))}",
            flush=True,
        )
    failures = [(v, r) for v, r in rows if problems(v, r)]
    summary = (
        f"{len(rows)} variants compiled for sm_90 in {time.monotonic() - started:.0f} s (triton {triton.__version__}, "
        f"torch {torch.__version__}); slowest {max(r.seconds for _, r in rows):.1f} s; "
        f"{sum(1 for v, r in rows if r.spill_stores and v.hot)} hot variants spill; {len(failures)} problems."
    )
    lines = table(rows)
    print("\n".join(lines) + "\n\n" + summary)
    if args.output:
        header = [
            "# Triton kernels compiled for sm_90 (H100) without a GPU",
            "",
            "Generated by `PYTHONPATH=.:python python bench/triton_compile_check.py --output "
            "bench/RESULTS_triton_compile.md` on a 2-core CPU machine shared with other jobs (compile times are "
            "wall clock: noisy).  One row per distinct kernel variant that bench/gpu_report.py and "
            "bench/gpu_ops_report.py launch; registers, spills and stack from `ptxas -v -arch=sm_90a` on the "
            "PTX Triton emits; shared memory from Triton's metadata.  Hot = every kernel but the tiled "
            "long-row ones (`(tiled)`).",
            "",
            summary,
            "",
        ]
        args.output.write_text("\n".join(header + lines) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
