"""pytest-benchmark: the C++ CPU kernels of sparsemax, top_tau and gather_tokens (through the
public ops, backend forced to ``cpp``) against their PyTorch composites (the references) and the
best public implementations, at SOP's shapes, on CPU tensors::

    python -m pytest bench/test_bench_ops.py --benchmark-only --benchmark-group-by=group

Implementations per group: ``cpp`` (sopfast.ops, SOPFAST_BACKEND=cpp), ``composite`` (the
op's PyTorch reference), and ``entmax`` (``entmax.sparsemax``) for sparsemax or ``torch`` (the
natural torch code: softmax + topk + scatter; index_select) for top_tau and gather_tokens.
top_tau's groups use the logits tie rule (as the natural code); ``test_top_tau_tie_rules_interleaved``
times the authors' rule (``ties="authors"``, the default) against it on one thread, the
implementations taking turns in every round.
gather_tokens also records the peak of live tensor memory of one call (torch profiler) in
``extra_info["peak_mib"]``.  Results: bench/RESULTS_ops.md.  Never asserts speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from sopfast.ops import (
    _backends,
    gather_tokens,
    gather_tokens_reference,
    gaussian_kernel1d,
    sparsemax,
    sparsemax_reference,
    top_tau,
    top_tau_reference,
)

entmax = pytest.importorskip("entmax")
pytest.importorskip("pytest_benchmark")
if not _backends.has_cpp():
    pytest.skip("sopfast._C is not built", allow_module_level=True)

ROUNDS = 10  # this 2-core machine is shared: compare minima (see RESULTS_ops.md)
TAU = 0.2

# ---- inputs at SOP's shapes ----


def sparsemax_input(rows: int, n: int, requires_grad: bool) -> torch.Tensor:
    return torch.randn(rows, n, generator=torch.Generator().manual_seed(0)).requires_grad_(requires_grad)


def top_tau_input(rows: int, d: int, requires_grad: bool) -> torch.Tensor:
    return torch.randn(rows, d, generator=torch.Generator().manual_seed(1)).requires_grad_(requires_grad)


def gather_tokens_input(requires_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ViT-B/16 tokens ``x [64, 197, 768]`` and ``indices [64, 20, 39]`` of 20 groups keeping 20 % of
    the 196 patches (the CLS token is the always-kept prefix)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 197, 768, generator=gen).requires_grad_(requires_grad)
    indices = torch.rand(64, 20, 196, generator=gen).argsort(dim=-1)[..., :39].sort(dim=-1).values + 1
    return x, indices


# ---- the natural torch code a user would write ----


def top_tau_torch(logits: torch.Tensor, k: int, blur_size: int, grid: tuple[int, int] | None) -> torch.Tensor:
    """Blur (reflect-padded separable conv) -> softmax -> topk -> scatter mask -> lam."""
    s = logits
    if blur_size > 1:
        kernel = gaussian_kernel1d(blur_size, 1.0)
        pad = blur_size // 2
        h, w = grid
        img = F.pad(s.reshape(-1, 1, h, w), (pad, pad, pad, pad), mode="reflect")
        img = F.conv2d(img, kernel.view(1, 1, 1, -1))
        s = F.conv2d(img, kernel.view(1, 1, -1, 1)).reshape_as(logits)
    a = torch.softmax(s, dim=-1)
    mask = torch.zeros_like(s, dtype=torch.bool).scatter_(1, s.topk(k, dim=-1).indices, True)
    return 2 * (a * mask).sum(dim=-1) - 1


def gather_tokens_torch(x: torch.Tensor, indices: torch.Tensor, prefix: int) -> torch.Tensor:
    """index_select of flat token rows, the prefix prepended to every group's indices."""
    b, t, e = x.shape
    _, m, k = indices.shape
    head = torch.arange(prefix).expand(b, m, prefix)
    flat = torch.cat([head, indices], dim=-1) + (torch.arange(b) * t).view(b, 1, 1)
    return x.reshape(b * t, e).index_select(0, flat.reshape(-1)).reshape(b * m, prefix + k, e)


# ---- helpers ----


def forward_and_backward(forward: Callable[[], torch.Tensor], leaf: torch.Tensor) -> Callable[[], None]:
    """One training step of ``forward``: its output, then backward of a fixed random (contiguous)
    upstream gradient into ``leaf``."""
    with torch.no_grad():
        upstream = torch.randn(forward().shape, generator=torch.Generator().manual_seed(3))

    def step() -> None:
        leaf.grad = None
        forward().backward(upstream)

    return step


def peak_tensor_mib(fn: Callable[[], object]) -> float:
    """Peak of live tensor memory during one call of ``fn`` (MiB), from the profiler's allocation
    events (each op's own allocations minus frees, in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for _, delta in sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()):
        live += delta
        peak = max(peak, live)
    return peak / 2**20


def run(benchmark, group: str, fn: Callable[[], object]) -> None:
    benchmark.group = group
    benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=1)


@pytest.fixture
def backend(monkeypatch):
    """Forces the C++ kernels for the ``cpp`` cases (an unavailable backend is an error)."""
    monkeypatch.setenv("SOPFAST_BACKEND", "cpp")


# ---- sparsemax: 64k x 20 (group selector) and 8k x 1000 ----

SPARSEMAX_SHAPES = [(65536, 20), (8192, 1000)]


def sparsemax_impl(impl: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return {
        "cpp": sparsemax,
        "composite": sparsemax_reference,
        "entmax": lambda x: entmax.sparsemax(x, dim=-1),
    }[impl]


@pytest.mark.parametrize("impl", ["cpp", "composite", "entmax"])
@pytest.mark.parametrize(("rows", "n"), SPARSEMAX_SHAPES, ids=[f"{r}x{n}" for r, n in SPARSEMAX_SHAPES])
def test_sparsemax_forward(benchmark, backend, impl, rows, n):
    x, op = sparsemax_input(rows, n, requires_grad=False), sparsemax_impl(impl)
    with torch.no_grad():
        run(benchmark, f"sparsemax fwd {rows}x{n}", lambda: op(x))


@pytest.mark.parametrize("impl", ["cpp", "composite", "entmax"])
@pytest.mark.parametrize(("rows", "n"), SPARSEMAX_SHAPES, ids=[f"{r}x{n}" for r, n in SPARSEMAX_SHAPES])
def test_sparsemax_forward_backward(benchmark, backend, impl, rows, n):
    x, op = sparsemax_input(rows, n, requires_grad=True), sparsemax_impl(impl)
    run(benchmark, f"sparsemax fwd+bwd {rows}x{n}", forward_and_backward(lambda: op(x), x))


# ---- top_tau: 4096 x 196 (14 x 14 grid, blur 3 on / off) and 4096 x 512 ----

TOP_TAU_CASES = {  # name -> (d, grid, blur kernel size)
    "4096x196 grid14 blur3": (196, (14, 14), 3),
    "4096x196 grid14 noblur": (196, (14, 14), 0),
    "4096x512 noblur": (512, None, 0),
}


def top_tau_impl(impl: str, d: int, grid, blur: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """logits -> lam of one implementation."""
    k = int(TAU * d)
    ties = "authors" if impl.endswith("authors") else "logits"
    if impl.startswith("cpp"):
        return lambda x: top_tau(x, TAU, blur_kernel_size=blur, grid=grid, ties=ties).lam
    if impl.startswith("composite"):
        kernel = gaussian_kernel1d(blur, 1.0) if blur > 1 else None
        k_rows = torch.full((4096,), k)
        grid_hw = grid or (0, 0)
        return lambda x: (
            top_tau_reference(x, k_rows, k, None, True, kernel, *grid_hw, ties_authors=ties == "authors").lam
        )
    return lambda x: top_tau_torch(x, k, blur, grid)


@pytest.mark.parametrize("impl", ["cpp", "composite", "torch"])
@pytest.mark.parametrize("case", list(TOP_TAU_CASES))
def test_top_tau_forward(benchmark, backend, impl, case):
    d, grid, blur = TOP_TAU_CASES[case]
    x, op = top_tau_input(4096, d, requires_grad=False), top_tau_impl(impl, d, grid, blur)
    with torch.no_grad():
        run(benchmark, f"top_tau fwd {case}", lambda: op(x))


@pytest.mark.parametrize("impl", ["cpp", "composite", "torch"])
@pytest.mark.parametrize("case", list(TOP_TAU_CASES))
def test_top_tau_forward_backward(benchmark, backend, impl, case):
    d, grid, blur = TOP_TAU_CASES[case]
    x, op = top_tau_input(4096, d, requires_grad=True), top_tau_impl(impl, d, grid, blur)
    run(benchmark, f"top_tau fwd+bwd {case}", forward_and_backward(lambda: op(x), x))


TIE_RULE_IMPLS = ["cpp authors", "cpp logits", "composite authors", "composite logits", "torch"]


@pytest.mark.parametrize("case", list(TOP_TAU_CASES))
def test_top_tau_tie_rules_interleaved(benchmark, backend, case):
    """The authors' tie rule (rank the attention) vs the logits rule, C++ and composite, and the natural
    torch code, on one thread, the implementations taking turns in every round (a shared machine
    slows them alike).  ``extra_info`` holds each one's min and median ms; the benchmark itself times
    the C++ authors' rule."""
    d, grid, blur = TOP_TAU_CASES[case]
    x = top_tau_input(4096, d, requires_grad=False)
    impls = {name: top_tau_impl(name, d, grid, blur) for name in TIE_RULE_IMPLS}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = {name: [] for name in impls}
        with torch.no_grad():
            for round_ in range(ROUNDS + 1):  # the first round warms up
                for name, op in impls.items():
                    start = time.perf_counter()
                    op(x)
                    if round_:
                        times[name].append((time.perf_counter() - start) * 1e3)
            for name, ms in times.items():
                benchmark.extra_info[f"{name} min ms"] = min(ms)
                benchmark.extra_info[f"{name} median ms"] = statistics.median(ms)
            run(benchmark, f"top_tau tie rules fwd {case} (1 thread)", lambda: impls["cpp authors"](x))
    finally:
        torch.set_num_threads(threads)


# ---- gather_tokens: B=64, T=197, E=768, m=20, k=39, CLS prefix ----


def gather_tokens_impl(impl: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return {
        "cpp": lambda x, idx: gather_tokens(x, idx, prefix=1),
        "composite": lambda x, idx: gather_tokens_reference(x, idx, 1),
        "torch": lambda x, idx: gather_tokens_torch(x, idx, 1),
    }[impl]


@pytest.mark.parametrize("impl", ["cpp", "composite", "torch"])
def test_gather_tokens_forward(benchmark, backend, impl):
    (x, indices), op = gather_tokens_input(requires_grad=False), gather_tokens_impl(impl)
    with torch.no_grad():
        benchmark.extra_info["peak_mib"] = peak_tensor_mib(lambda: op(x, indices))
        run(benchmark, "gather_tokens fwd 64x197x768 m20 k39", lambda: op(x, indices))


@pytest.mark.parametrize("impl", ["cpp", "composite", "torch"])
def test_gather_tokens_forward_backward(benchmark, backend, impl):
    (x, indices), op = gather_tokens_input(requires_grad=True), gather_tokens_impl(impl)
    step = forward_and_backward(lambda: op(x, indices), x)
    benchmark.extra_info["peak_mib"] = peak_tensor_mib(step)
    run(benchmark, "gather_tokens fwd+bwd 64x197x768 m20 k39", step)
