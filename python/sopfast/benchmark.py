"""Side-by-side timing of the authors' algorithm (``sopfast.model.reference``) vs ``exact`` vs ``drop``.

Used by ``sopfast bench``, the demo and ``bench/``.  Times are medians of repeated runs in
one process; compare the ratios, not the absolute numbers.  Peak memory is the process's
resident-set high-water mark above its level before the step (Linux, CPU; reset through
``/proc/self/clear_refs``) or ``torch.cuda.max_memory_allocated`` on CUDA.
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from . import testing
from .devices import adamw, module_device
from .model.output import SOPOutput
from .model.reference import reference_forward
from .model.sop import SOP


@dataclass
class BenchResult:
    """One variant's timing: ``seconds`` per step (median), throughput and peak memory (MiB)."""

    name: str
    seconds: float
    samples_per_s: float
    peak_mib: float | None


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _release_free_heap() -> None:
    """Return freed heap pages to the OS (glibc keeps them otherwise, hiding later peaks)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory_mib(fn: Callable[[], object], device: torch.device) -> float | None:
    """Extra memory at the peak of one call of ``fn`` (MiB), or ``None`` when it cannot be read."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    _release_free_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    rss_before = _rss_kib("VmRSS")
    fn()
    peak = _rss_kib("VmHWM")
    return None if rss_before is None or peak is None else max(0, peak - rss_before) / 1024


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure_interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int, device: torch.device, memory: bool = True
) -> dict[str, tuple[float, float | None]]:
    """Median wall time of each function over ``repeats`` rounds, the functions taking turns in
    every round (so a noisy machine slows them alike), after ``warmup`` rounds; and each one's
    peak memory in the last round (MiB; ``None`` when not measured)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    peaks: dict[str, float | None] = dict.fromkeys(fns)
    for round_ in range(max(1, repeats)):
        for name, fn in fns.items():
            if round_ == repeats - 1 and memory:

                def run(fn=fn, name=name) -> None:
                    peaks[name] = peak_memory_mib(fn, device)

                times[name].append(_timed(run, device))
            else:
                times[name].append(_timed(fn, device))
    return {name: (statistics.median(times[name]), peaks[name]) for name in fns}


def step_functions(model: SOP, args: tuple, labels: torch.Tensor, train: bool) -> dict[str, Callable[[], object]]:
    """One inference forward (``train=False``) or one training step per variant."""
    variants: dict[str, Callable[[], SOPOutput]] = {"reference": lambda: reference_forward(model, *args)}
    for mode in ("exact", "drop"):
        if mode in model.adapter.supported_modes:
            variants[mode] = partial(model, *args, mode=mode)
    if not train:
        return {name: _no_grad(fn) for name, fn in variants.items()}
    optimizer = adamw(model.trainable_parameters(), lr=1e-6)

    def training_step(forward: Callable[[], SOPOutput]) -> Callable[[], None]:
        def run() -> None:
            optimizer.zero_grad(set_to_none=True)
            # The forwards get no labels, so ``out.loss`` is ``out.compute_loss``; called directly for its type.
            forward().compute_loss(labels).backward()
            optimizer.step()

        return run

    return {name: training_step(fn) for name, fn in variants.items()}


def _no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return fn()

    return run


def compare_modes(
    model: SOP,
    args: tuple,
    labels: torch.Tensor,
    train: bool = False,
    repeats: int = 3,
    warmup: int = 1,
    memory: bool = True,
) -> list[BenchResult]:
    """Time reference / exact / drop on one batch (``args`` as passed to ``model``), interleaved;
    the peak memory is read during the last round."""
    model.train(train)
    device = module_device(model)
    batch = int(args[0].shape[0])
    results = []
    measured = measure_interleaved(step_functions(model, args, labels, train), repeats, warmup, device, memory)
    for name, (seconds, peak) in measured.items():
        results.append(BenchResult(name, seconds, batch / seconds, peak))
    return results


def format_table(results: list[BenchResult], ideal: float | None = None) -> str:
    """Markdown table with speed-up and memory ratio relative to the reference."""
    base = next(r for r in results if r.name == "reference")
    lines = [
        "| variant | s/step | samples/s | speed-up vs reference | peak MiB | memory vs reference |"
        + (" % of ideal FLOP ratio |" if ideal else ""),
        "|---|---|---|---|---|---|" + ("---|" if ideal else ""),
    ]
    for r in results:
        speedup = base.seconds / r.seconds
        mem = f"{r.peak_mib:.0f}" if r.peak_mib is not None else "n/a"
        mem_ratio = f"{r.peak_mib / base.peak_mib:.2f}×" if r.peak_mib and base.peak_mib else "n/a"
        row = f"| {r.name} | {r.seconds:.3f} | {r.samples_per_s:.2f} | {speedup:.2f}× | {mem} | {mem_ratio} |"
        if ideal:
            row += f" {100 * speedup / ideal:.0f}% |" if r.name == "drop" else " |"
        lines.append(row)
    return "\n".join(lines)


# -- ``sopfast bench`` ---------------------------------------------------------------------------
def _bench_backbone(name: str) -> tuple[nn.Module, str]:
    """A randomly initialised backbone for ``sopfast bench --model name`` and its input kind
    (``image``, ``cnn``, ``text`` or ``pair``); the ResNet's feature layer is its adapter's."""
    if name.startswith("bert-base"):
        return testing.bert("base", seed=None), "pair" if name.endswith("pair") else "text"
    if name == "cnn":
        return testing.resnet18(seed=None), "cnn"
    return testing.vit("b16" if name == "vit-b16" else "bench-small", num_labels=10, seed=None), "image"


def _bench_inputs(kind: str, batch: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Random images ``[B, 3, 224, 224]``, or 512-token texts (``pair``: the last 128 tokens a second segment)."""
    if kind in ("image", "cnn"):
        return (torch.randn(batch, 3, 224, 224, device=device),)
    ids = torch.randint(1000, 20000, (batch, 512), device=device)
    types = torch.zeros_like(ids)
    if kind == "pair":
        types[:, 384:] = 1
    return ids, torch.ones_like(ids), types


def run_bench(
    name: str, batch: int, groups: int, train: bool, repeats: int, device: torch.device, warmup: int = 1
) -> str:
    """Reference vs exact vs drop on one randomly initialised backbone (``sopfast bench``); a markdown table."""
    torch.manual_seed(0)
    backbone, kind = _bench_backbone(name)
    model = SOP(backbone, num_groups=groups, tau=0.2, recipe="paper").to(device)
    args = _bench_inputs(kind, batch, device)
    labels = torch.zeros(batch, dtype=torch.long, device=device)
    results = compare_modes(model, args, labels, train=train, repeats=repeats, warmup=warmup)
    ideal = model.adapter.drop_flop_ratio(model.prepare(*args), model.tau, model.num_groups, train)
    header = f"{name}, batch {batch}, m={groups}, {'training step' if train else 'forward'}, device {device}"
    return f"{header}\n{format_table(results, ideal)}"
