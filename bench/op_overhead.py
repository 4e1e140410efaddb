"""Per-call cost of the public ops on tiny CPU tensors, where the call, not the kernel, is the cost
(issue #30: ≤ 8 µs for a ``[4, 20]`` sparsemax), beside the torch op a user would otherwise call::

    PYTHONPATH=.:python python bench/op_overhead.py                          # this tree, printed
    PYTHONPATH=.:python python bench/op_overhead.py --before DIR --rounds 5  # DIR's tree vs this one

``--before DIR`` (a checkout with its extension built, e.g. ``git archive`` of an older commit plus its
``_C*.so``; ``--before-label`` says what it is) runs the same cases in a fresh process of each tree,
the two taking turns for ``--rounds`` rounds, and writes the Markdown table (``--output``, default
bench/RESULTS_op_overhead.md): the minimum over rounds of each case's best µs per call (``timeit``:
REPEATS repeats of ``--number`` calls, one thread), each case's ratio to ``torch.softmax`` on
``[4, 20]`` measured in the same process, and each public op's overhead over its kernel alone.
Never asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 25  # timeit repeats per case and round: the minimum finds the quiet moments of a shared machine


def cases() -> dict[str, Callable[[], object]]:
    """Every timed call, by name: the public ops (no gradient and on a leaf that requires one), the
    dispatcher op where the tree has one, and the torch calls they stand beside."""
    import torch

    from sopfast import ops

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 20, generator=gen)
    x_grad = x.clone().requires_grad_()
    logits = torch.randn(4, 196, generator=gen)
    tokens = torch.randn(2, 197, 64, generator=gen)
    indices = torch.randint(0, 196, (2, 4, 39), generator=gen) + 1
    flat = (indices + torch.arange(2).view(2, 1, 1) * 197).reshape(-1)
    timed: dict[str, Callable[[], object]] = {
        "torch.softmax [4, 20]": lambda: torch.softmax(x, -1),
        "ops.sparsemax [4, 20]": lambda: ops.sparsemax(x),
        "ops.sparsemax [4, 20], input requires grad": lambda: ops.sparsemax(x_grad),
        "torch.topk [4, 196], k=39": lambda: torch.topk(logits, 39),
        "ops.top_tau [4, 196], tau=0.2": lambda: ops.top_tau(logits, 0.2),
        "ops.top_tau [4, 196], tau=0.2, blur 3 on 14x14": lambda: ops.top_tau(
            logits, 0.2, blur_kernel_size=3, grid=(14, 14)
        ),
        "torch.index_select [2·197, 64] → [312, 64]": lambda: tokens.reshape(-1, 64).index_select(0, flat),
        "ops.gather_tokens [2, 197, 64], 4 groups of 39 + 1": lambda: ops.gather_tokens(tokens, indices, 1),
    }
    sopfast_ops = torch.ops.sopfast
    if hasattr(sopfast_ops, "sparsemax"):
        timed["torch.ops.sopfast.sparsemax [4, 20]"] = lambda: sopfast_ops.sparsemax(x)
    # the C++ kernels alone, through their pybind entry points: the public op's overhead is the difference
    native = ops._backends.native_extension()
    k = torch.full((4,), 39, dtype=torch.int64)
    timed["kernel: sparsemax_forward_cpu [4, 20]"] = lambda: native.sparsemax_forward_cpu(x)
    timed["kernel: top_tau_forward_cpu [4, 196]"] = lambda: native.top_tau_forward_cpu(
        logits, k, 39, None, True, True, None, 0, 0
    )
    timed["kernel: gather_tokens_forward_cpu"] = lambda: native.gather_tokens_forward_cpu(tokens, indices, 1)
    return timed


# public op -> its kernel alone (rows of the overhead table)
OVERHEADS = {
    "ops.sparsemax [4, 20]": "kernel: sparsemax_forward_cpu [4, 20]",
    "ops.top_tau [4, 196], tau=0.2": "kernel: top_tau_forward_cpu [4, 196]",
    "ops.gather_tokens [2, 197, 64], 4 groups of 39 + 1": "kernel: gather_tokens_forward_cpu",
}


def measure(number: int) -> dict[str, float]:
    """Best µs per call of every case, one thread."""
    import torch

    torch.set_num_threads(1)
    results = {}
    for name, fn in cases().items():
        fn()
        results[name] = min(timeit.repeat(fn, number=number, repeat=REPEATS)) / number * 1e6
    return results


def run_tree(tree: Path, number: int) -> dict[str, float]:
    """:func:`measure` in a fresh process importing ``sopfast`` from ``tree``."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'python'}:{tree}", "SOPFAST_BACKEND": ""}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", "--number", str(number)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def git_commit(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout)"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def markdown(before: Path, label: str, rounds: int, number: int, runs: dict[str, list[dict[str, float]]]) -> str:
    import torch

    best = {tree: {} for tree in runs}
    for tree, measured in runs.items():
        for name in measured[0]:
            best[tree][name] = min(m[name] for m in measured if name in m)
    base = "torch.softmax [4, 20]"
    lines = [
        "# Per-call cost of the public ops on tiny CPU tensors",
        "",
        f"`bench/op_overhead.py --before {before} --rounds {rounds} --number {number}`: the two trees in fresh "
        f"processes taking turns, {rounds} rounds; best µs per call (timeit, {REPEATS} × {number} calls, one thread), "
        f"minimum over rounds; × softmax = the case over `torch.softmax` on `[4, 20]` in the same tree's runs.",
        f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs (shared with other jobs); Python "
        f"{platform.python_version()}, torch {torch.__version__}.",
        f"before: {label or f'`{before}` ({git_commit(before)})'}; after: this tree ({git_commit(ROOT)}).",
        "",
        "| call | before µs | after µs | before × softmax | after × softmax |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in runs["after"][0]:
        cells = []
        for tree in ("before", "after"):
            value = best[tree].get(name)
            cells.append("n/a" if value is None else f"{value:.2f}")
        ratios = []
        for tree in ("before", "after"):
            value = best[tree].get(name)
            ratios.append("n/a" if value is None else f"{value / best[tree][base]:.1f}")
        lines.append(f"| {name} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    lines += [
        "",
        "Overhead of the public op = its µs − its kernel's µs (the kernel called alone through its pybind entry",
        "point `sopfast._C.<op>_forward_cpu`, which adds about 1 µs of its own):",
        "",
        "| public op | before overhead µs | after overhead µs |",
        "| --- | ---: | ---: |",
    ]
    for name, kernel in OVERHEADS.items():
        lines.append(
            f"| {name} | {best['before'][name] - best['before'][kernel]:.2f} | "
            f"{best['after'][name] - best['after'][kernel]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="an older tree to compare with, its extension built")
    parser.add_argument("--before-label", default="", help="what the --before tree is (default: its path and commit)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=500, help="calls per timeit repeat")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS_op_overhead.md")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.number)))
        return 0
    if args.before is None:
        for name, us in measure(args.number).items():
            print(f"{us:8.2f} µs  {name}")
        return 0
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        runs["before"].append(run_tree(args.before.resolve(), args.number))
        runs["after"].append(run_tree(ROOT, args.number))
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    args.output.write_text(markdown(args.before, args.before_label, args.rounds, args.number, runs))
    print(args.output.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
