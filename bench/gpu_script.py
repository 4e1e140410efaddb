"""The GPU script (issue #29 item 4): about four minutes on one H100 or H200, from a fresh copy of the
source tree, one command (it builds the extension with the CUDA kernels first)::

    python bench/gpu_script.py                 # bench/gpu/<card>.md and bench/gpu/summary.json
    python bench/gpu_script.py --dry-run       # tiny shapes on the CPU, same code paths (CI runs it)

Steps, in this order, the Markdown (and ``summary.json``) rewritten after each, so a run cut off keeps
what it measured; each step starts only within its budget (``STEP_BUDGET_S``):

0. **build** — ``python setup.py build_ext --inplace`` with the CUDA kernels (``SOPFAST_BUILD_CUDA=1``),
   before sopfast is imported (importing it registers the kernels in PyTorch's dispatcher);
1. **probe and op checks** — where ``torch.sort`` puts a NaN with the sign bit set on this device, and
   whether :func:`sopfast.ops.counts.canonical_for_sort` gives the CPU's order; then every op check of
   bench/gpu_report.py (rows without a result skipped, the authors' rule checked on the kernel's own
   attention with near ties allowed);
2. **gates** — fp32 parity with TF32 off (exact = the authors' algorithm) and the bf16 calibration
   (exact's errors within 1.5× the authors' own bf16 errors), ViT-B/16 and BERT-base;
3. **CUDA test items** — the README's test command restricted to them (``-k cuda -x``, in a time
   budget), its summary line;
4. **sync-debug** — ``tests/test_no_host_sync.py::test_no_sync_on_a_gpu``
   (``torch.cuda.set_sync_debug_mode("error")``);
5. **training** — the authors' algorithm, exact and drop, ViT-B/16 at 224 (batch 8 and 32) and BERT-base
   at 512 tokens (batch 4 and 16), bf16 autocast, interleaved;
6. **kernels** — top_tau forward at 65,536 × 196 (fp32 and bf16) and sparsemax over 20 columns at
   1,048,576 rows: GB/s of the ideal traffic, % of the card's peak; the CUDA sparsemax twice, side by
   side: the thread-rows kernel (the default) and the warp-rows one (``SOPFAST_CUDA_SPARSEMAX=warp-rows``,
   issue #46), after checking that both give the same bits; ``summary.json`` keeps every implementation's
   figure (``kernel_hbm_percent``);
7. **compile** — ViT-B/16 drop forward at batch 128, bf16 autocast, interleaved: eager; the backbone held
   in bf16 (``SOP(backbone_dtype="bfloat16")``: no per-call weight casts); that and ``SOP(compile=True)``
   (the blocks through ``torch.compile``, inductor; the ``eager`` backend in the dry run) — what decides
   whether ``compile="auto"`` should become the default on a GPU.

``summary.json`` holds the figures tools read (``null`` where this run measured nothing).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# seconds each step may start checks for, in the order they run (the build is not counted)
STEP_BUDGET_S = {
    "probe and op checks": 75.0,
    "gates": 35.0,
    "CUDA test items": 60.0,
    "sync-debug": 25.0,
    "ViT training": 30.0,
    "BERT training": 30.0,
    "kernels": 15.0,
    "compile": 60.0,
}
BUILD_TIMEOUT_S = 400
SUMMARY_KEYS = (
    "card",
    "vit_b16_drop_forward_b128_images_per_s",
    "vit_b16_drop_train_b32_x_authors",
    "bert512_drop_train_b16_x_authors",
    "top_tau_hbm_percent",
    "sparsemax20_hbm_percent",
    "op_checks_failed",
    "cuda_test_items_passed",
    "cuda_test_items_failed",
    "sync_debug_ok",
    "kernel_hbm_percent",
    "date",
)
# the CUDA sparsemax kernel for rows of up to 32 entries (csrc/cuda/ops_cuda.cpp reads it at each call)
SPARSEMAX_KERNEL_VARIABLE = "SOPFAST_CUDA_SPARSEMAX"
# what a lease runs, from a fresh copy of the tree (bench/RESULTS_gpu.md quotes it)
LEASE_COMMAND = "python bench/gpu_script.py"


def build_extension(dry: bool) -> str:
    """Builds ``sopfast._C`` in place (with the CUDA kernels on a GPU machine); returns a one-line status."""
    if dry:
        return "dry run: the extension of this tree is used as built"
    env = {**os.environ, "SOPFAST_BUILD_CUDA": "1", "MAX_JOBS": str(os.cpu_count() or 8)}
    start = time.monotonic()
    log = ROOT / "build" / "gpu_script_build.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        code: int | str
        try:
            code = subprocess.run(
                [sys.executable, "setup.py", "build_ext", "--inplace"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S,
            ).returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {BUILD_TIMEOUT_S} s"
    # without the extension the steps still run, on the references (and say so in the backends line)
    status = "built" if code == 0 else f"FAILED ({code}; see {log.relative_to(ROOT)})"
    return f"extension {status} in {time.monotonic() - start:.0f} s"


def load_gpu_report():
    """bench/gpu_report.py as a module (it imports sopfast: only after the build)."""
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "bench" / "gpu_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Script:
    """The run: the report of bench/gpu_report.py (checks, tables) plus the summary figures, both written
    after every check."""

    def __init__(self, gr, device, dry: bool, out_dir: Path, build_status: str) -> None:
        import torch

        self.gr, self.device, self.dry = gr, device, dry
        self.card = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
        slug = re.sub(r"[^a-z0-9]+", "_", self.card.lower()).strip("_")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.markdown = out_dir / f"{'dry_run' if dry else slug}_gpu_script.md"
        self.summary_path = out_dir / "summary.json"
        self.summary: dict[str, object] = dict.fromkeys(SUMMARY_KEYS)
        self.summary["card"] = self.card
        self.summary["date"] = datetime.date.today().isoformat()
        self.report = gr.Report(device, dry, math.inf, started=time.monotonic(), writer=self.write)
        self.report.output = self.markdown
        self.report.environment = [build_status + ".", *gr.environment(device)]

    def step(self, name: str) -> None:
        self.report.begin(name, STEP_BUDGET_S[name])
        STEPS[name](self)
        self.write()

    def write(self, *_: object) -> None:
        gr, report = self.gr, self.report
        failed_ops = sum(c.status in ("FAIL", "error") for c in report.checks if c.section == "ops")
        ran_ops = any(c.section == "ops" and c.status != "skipped" for c in report.checks)
        self.summary["op_checks_failed"] = failed_ops if ran_ops else None
        lines = [
            f"# sopfast GPU script — {self.card}",
            "",
            f"`{LEASE_COMMAND}{' --dry-run' if self.dry else ''}`, {time.monotonic() - report.started:.0f} s so far: "
            f"torch {gr.torch.__version__}, triton {gr._triton_version()}, backends "
            f"{gr._backends.backends()['available']}, on {self.summary['date']}.",
            *report.environment,
            "",
            *gr.checks_and_tables(report, "step"),
        ]
        lines += ["## summary.json", "", "```json", json.dumps(self.summary, indent=2), "```", ""]
        self.markdown.write_text("\n".join(lines))
        self.summary_path.write_text(json.dumps(self.summary, indent=2) + "\n")


# ----------------------------------------------------------------------------- 1. probe and op checks


def probe(script: Script) -> None:
    """Where a NaN with the sign bit set sorts on this device, before and after canonicalisation."""
    import torch

    from sopfast.ops.counts import canonical_for_sort

    gr, device = script.gr, script.device
    script.report.row("sort probe", ["row length", "−NaN raw (of −inf, −NaN, +NaN, 1)", "after canonical_for_sort"])
    script.report.row("sort probe", ["---:", "---", "---"])

    def run() -> str:
        found = []
        for d in (8, 8192):
            x = torch.zeros(d)
            x[:4] = torch.tensor([1.0, gr.negative_nan(), -gr.INF, float("nan")])
            x = x.to(device)
            places = []
            for values in (x, canonical_for_sort(x)):
                order = torch.sort(values, stable=True).indices.cpu().tolist()
                places.append("below −inf" if order.index(1) < order.index(2) else "above +inf")
            script.report.row("sort probe", [d, *places])
            found.append(f"d={d}: raw {places[0]}, canonical {places[1]}")
            assert places[1] == "above +inf", "canonical_for_sort does not rank NaN last here"
        return "; ".join(found)

    script.report.run("probe and op checks", "sign-bit NaN sort probe", run)


def probe_and_op_checks(script: Script) -> None:
    """The probe, then bench/gpu_report.py's op checks (recorded as section "ops")."""
    probe(script)
    for check, args in script.gr.ops_checks(script.dry):
        check(script.report, *args)


# ----------------------------------------------------------------------------- 3, 4. tests


def pytest_counts(text: str) -> dict[str, int]:
    """``{"passed": n, "failed": n, ...}`` from a pytest summary line."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", text)}


def run_pytest(script: Script, name: str, args: list[str]) -> dict[str, int]:
    """pytest in a subprocess within the step's budget; records its summary line (or, when the budget
    stops it, the progress it made)."""
    budget = STEP_BUDGET_S[name] * (3 if script.dry else 1)  # a dry run's CPU imports slowly
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args]
    counts: dict[str, int] = {}

    def run() -> str:
        nonlocal counts
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=budget)
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            summary = next((line for line in reversed(lines) if pytest_counts(line)), lines[-1] if lines else "")
            counts = pytest_counts(summary)
            script.report.row(name, [f"`{' '.join(command[1:])}`", summary.strip("= ")])
            assert done.returncode in (0, 5), summary  # 5: nothing collected
            return summary.strip("= ")
        except subprocess.TimeoutExpired as stopped:
            partial = stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else (stopped.stdout or "")
            progress = "".join(line for line in partial.splitlines() if re.fullmatch(r"[.sFExX]+( \[.*\])?", line))
            counts = {"passed": progress.count("."), "failed": progress.count("F") + progress.count("E")}
            summary = f"stopped by the {budget:.0f} s budget after {counts['passed']} passed, {counts['failed']} failed"
            script.report.row(name, [f"`{' '.join(command[1:])}`", summary])
            assert counts["failed"] == 0, summary
            return summary

    script.report.tables.setdefault(name, ["| command | summary |", "| --- | --- |"])
    script.report.run(name, " ".join(args), run)
    return counts


def cuda_test_items(script: Script) -> None:
    """The README's test command (``python -m pytest -q tests``) restricted to the CUDA items."""
    target = ["tests/test_ops_dispatch.py"] if script.dry else ["tests"]
    counts = run_pytest(script, "CUDA test items", [*target, "-k", "cuda"])
    if counts:
        script.summary["cuda_test_items_passed"] = counts.get("passed", 0)
        script.summary["cuda_test_items_failed"] = counts.get("failed", 0) + counts.get("error", 0)


def sync_debug(script: Script) -> None:
    counts = run_pytest(script, "sync-debug", ["tests/test_no_host_sync.py::test_no_sync_on_a_gpu"])
    ran = counts.get("passed", 0) + counts.get("failed", 0)
    script.summary["sync_debug_ok"] = (counts.get("failed", 0) == 0) if ran and not script.dry else None


# ----------------------------------------------------------------------------- 5. training steps

# (backbone, batches, the summary figure of the largest batch's drop step): ViT-B/16 at 224, BERT-base at 512
TRAINING = {
    "ViT training": ("vit", (8, 32), "vit_b16_drop_train_b32_x_authors"),
    "BERT training": ("bert", (4, 16), "bert512_drop_train_b16_x_authors"),
}


def training(script: Script, step: str) -> None:
    """The authors' training step against exact and drop, bf16 autocast, interleaved."""
    import torch

    from sopfast.benchmark import step_functions

    gr, device, dry = script.gr, script.device, script.dry
    kind, batches, figure = TRAINING[step]
    script.report.row(step, ["batch", "variant", "median ms", "samples/s", "× authors"])
    script.report.row(step, ["---:", "---", "---:", "---:", "---:"])
    model = None
    for batch in (1, 2) if dry else batches:

        def run(batch=batch) -> str:
            nonlocal model
            if model is None:
                model = gr.build_model(kind, dry, device)
            model.train()
            args = gr.model_inputs(kind, batch, dry, device)
            labels = torch.zeros(batch, dtype=torch.long, device=device)
            steps = step_functions(model, args, labels, train=True)

            def under_autocast(fn: Callable[[], object]) -> Callable[[], object]:
                def call() -> object:
                    with gr.autocast(device):
                        return fn()

                return call

            variants = {name: under_autocast(fn) for name, fn in steps.items()}
            measured = gr.interleaved_ms(variants, device, 1 if dry else 2, 1 if dry else 6)
            authors = statistics.median(measured["reference"][0])
            ratios = {}
            for name, (times, _, error) in measured.items():
                assert not error, f"{name}: {error}"
                ms = statistics.median(times)
                ratios[name] = authors / ms
                label = "authors" if name == "reference" else name
                script.report.row(step, [batch, label, f"{ms:.1f}", f"{batch / ms * 1e3:.1f}", f"{ratios[name]:.2f}"])
            if batch == batches[-1] and not dry:
                script.summary[figure] = round(ratios["drop"], 3)
            return ", ".join(f"{name} {ratio:.2f}× authors" for name, ratio in ratios.items() if name != "reference")

        script.report.run(step, f"{gr.model_label(kind, dry)} training step, batch {batch}", run)


# ----------------------------------------------------------------------------- 6. kernels


def with_environment(fn: Callable[[], object], name: str, value: str) -> Callable[[], object]:
    """``fn`` called with the environment variable ``name`` set to ``value`` (restored after)."""

    def call() -> object:
        saved = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved

    return call


def sparsemax_kernels_side_by_side(impls: dict[str, Callable[[], object]]) -> str:
    """Adds the CUDA warp-rows sparsemax (``cuda warp-rows``) beside the thread-rows one (``cuda``) when the CUDA
    kernels run, after checking that both give the same bits; returns what the check found."""
    if "cuda" not in impls:
        return "no CUDA kernels: one sparsemax kernel timed"
    warp_rows = with_environment(impls["cuda"], SPARSEMAX_KERNEL_VARIABLE, "warp-rows")
    thread_rows = with_environment(impls["cuda"], SPARSEMAX_KERNEL_VARIABLE, "thread-rows")
    import torch

    same = torch.equal(warp_rows(), thread_rows())
    impls["cuda"] = thread_rows
    impls["cuda warp-rows"] = warp_rows
    return f"warp-rows {'equals' if same else 'DIFFERS FROM'} thread-rows bit for bit"


def kernels(script: Script) -> None:
    gr, device, dry = script.gr, script.device, script.dry
    peak = gr.peak_gbps(device)
    rows = 8 if dry else gr.TIMING_ROWS
    script.report.row("kernels", ["op", "impl", "ms", "GB/s", "% peak"])
    script.report.row("kernels", ["---", "---", "---:", "---:", "---:"])
    import torch

    cases = {
        "top_tau": [
            case
            for dtype in (torch.float32, torch.bfloat16)
            for case in gr.top_tau_timing_cases(rows, 196, None, 0, dtype, True, device)
        ],
        "sparsemax": gr.sparsemax_timing_cases(16 if dry else 2**20, 20, device)[:1],
    }

    def run(op: str) -> str:
        best: dict[str, list[float]] = {}
        found = ""
        for name, moved, impls in cases[op]:
            if op == "sparsemax":
                found = sparsemax_kernels_side_by_side(impls)
            for impl, fn in impls.items():
                if impl == "torch" and not dry:
                    continue
                try:
                    ms = gr.time_ms(fn, device, 1 if dry else 50, warmup=0 if dry else 5)
                except RuntimeError as error:  # one backend failing to compile leaves the others' rows
                    script.report.row("kernels", [name, impl, f"{type(error).__name__}: {str(error)[:80]}", "", ""])
                    continue
                gbps = moved / ms / 1e6
                percent = 100 * gbps / peak if peak else math.nan
                script.report.row("kernels", [name, impl, f"{ms:.4f}", f"{gbps:.0f}", f"{percent:.1f}"])
                best.setdefault(impl, []).append(percent)
        if peak:
            # each backend at its worst dtype; the summary takes the best backend
            worst = {impl: min(values) for impl, values in best.items()}
            figure = f"{op}_hbm_percent" if op == "top_tau" else "sparsemax20_hbm_percent"
            script.summary[figure] = round(max(worst.values()), 1)
            by_impl = script.summary["kernel_hbm_percent"] or {}
            by_impl[figure] = {impl: round(value, 1) for impl, value in worst.items()}
            script.summary["kernel_hbm_percent"] = by_impl
        if "DIFFERS" in found:
            raise AssertionError(found)
        return f"peak {peak or 'n/a'} GB/s" + (f"; {found}" if found else "")

    script.report.run("kernels", f"top_tau forward {rows}x196 fp32 and bf16", lambda: run("top_tau"))
    script.report.run("kernels", "sparsemax forward over 20 columns", lambda: run("sparsemax"))


# ----------------------------------------------------------------------------- 7. compile


def compile_vit(script: Script) -> None:
    import torch

    from sopfast.model import runtime

    gr, device, dry = script.gr, script.device, script.dry
    batch = 2 if dry else 128
    script.report.row("ViT-B/16 drop forward", ["variant", "median ms", "images/s", "first call s"])
    script.report.row("ViT-B/16 drop forward", ["---", "---:", "---:", "---:"])
    variants = {
        "eager": {},
        "bf16 backbone": {"backbone_dtype": "bfloat16"},
        "bf16 backbone, compile=True": {"backbone_dtype": "bfloat16", "compile": True},
    }

    def run() -> str:
        (x,) = gr.model_inputs("vit", batch, dry, device)
        fns, first = {}, {}
        for name, options in variants.items():
            model = gr.build_model("vit", dry, device, **options)

            def forward(model=model):
                with torch.no_grad(), gr.autocast(device):
                    return model(x, mode="drop").logits

            start = time.monotonic()
            forward()  # compiles, where it does, outside the timed calls
            first[name] = time.monotonic() - start
            fns[name] = forward
        measured = gr.interleaved_ms(fns, device, 1 if dry else 2, 1 if dry else 5)
        rates = {}
        for name, (times, _, error) in measured.items():
            assert not error, f"{name}: {error}"
            ms = statistics.median(times)
            rates[name] = batch / ms * 1e3
            shown = f"{first[name]:.0f}" if variants[name].get("compile") else ""
            script.report.row("ViT-B/16 drop forward", [name, f"{ms:.1f}", f"{rates[name]:.0f}", shown])
        if not dry:
            script.summary["vit_b16_drop_forward_b128_images_per_s"] = round(max(rates.values()))
        return ", ".join(f"{name} {rate:.0f} images/s" for name, rate in rates.items())

    saved = dict(runtime.COMPILE_OPTIONS)
    if dry:
        runtime.COMPILE_OPTIONS["backend"] = "eager"  # inductor takes tens of seconds on a CPU
    try:
        script.report.run("compile", f"ViT-B/16 drop forward batch {batch}: eager, bf16 backbone, compiled", run)
    finally:
        runtime.COMPILE_OPTIONS.clear()
        runtime.COMPILE_OPTIONS.update(saved)


STEPS: dict[str, Callable[[Script], None]] = {
    "probe and op checks": probe_and_op_checks,
    "gates": lambda script: script.gr.gates_section(script.report),
    "CUDA test items": cuda_test_items,
    "sync-debug": sync_debug,
    "ViT training": lambda script: training(script, "ViT training"),
    "BERT training": lambda script: training(script, "BERT training"),
    "kernels": kernels,
    "compile": compile_vit,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU through the same code paths")
    parser.add_argument("--out-dir", type=Path, help="default: bench/gpu (a dry run: build/gpu_script_dry_run)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {list(STEPS)}")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.steps.split(",")]
    unknown = [name for name in chosen if name not in STEPS]
    if unknown:
        print(f"gpu_script: --steps {unknown} unknown; allowed: {list(STEPS)}", file=sys.stderr)
        return 2
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_script: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        sys.argv.append("--dry-run")  # gpu_report reads it at import (Triton's interpreter)
    sys.path[:0] = [str(ROOT / "python"), str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    status = build_extension(args.dry_run)
    print(status, flush=True)
    gr = load_gpu_report()
    device = torch.device("cpu" if args.dry_run else "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out_dir = args.out_dir or (ROOT / ("build/gpu_script_dry_run" if args.dry_run else "bench/gpu"))
    script = Script(gr, device, args.dry_run, out_dir, status)
    script.write()
    for name in chosen:
        script.step(name)
    print(f"gpu_script: wrote {script.markdown} and {script.summary_path}")
    return 0 if all(c.status in ("ok", "skipped") for c in script.report.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
