"""``SOP(compile=True)`` against eager on the CPU: a ``drop`` forward and a ``drop`` training step, side by
side (issue #29: "a compiled CPU path only if it measures faster"; ``compile="auto"`` compiles on CUDA
only).

A randomly initialised HF ViT (``sopfast.testing.vit``, default ViT-B/16 at 224²), the default recipe, 20
groups, τ = 0.2, fp32, batch ``--batch``.  Each variant is built from the same weights; the first call of
each (where inductor compiles: static shapes, one graph per chunk width) is timed apart; then the
variants take turns (interleaved rounds, median of ``--repeats``).  The training step is AdamW at lr 0, so
every round sees the same weights.  Run it with the threads a user has (``OMP_NUM_THREADS``):

    PYTHONPATH=python python bench/compile_cpu.py --out bench/RESULTS_compile_cpu.md
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable

import torch

import sopfast
from sopfast import testing


def build(backbone: torch.nn.Module, compile_blocks: bool) -> sopfast.SOP:
    """SOP over a copy of ``backbone``, the same generator weights for every variant."""
    torch.manual_seed(0)
    return sopfast.SOP(copy.deepcopy(backbone), num_groups=20, tau=0.2, mode="drop", compile=compile_blocks)


def forward_fn(model: sopfast.SOP, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        model.eval()
        with torch.no_grad():
            model(x)

    return run


def step_fn(model: sopfast.SOP, x: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=0.0)

    def run() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        model(x, labels=labels).loss.backward()
        optimizer.step()

    return run


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="b16", help="a sopfast.testing.VIT_SIZES name")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="append the Markdown table to this file")
    args = parser.parse_args()
    backbone = testing.vit(args.size)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, 224, 224, generator=g)
    models = {"eager": build(backbone, False), "compile=True": build(backbone, True)}
    labels = torch.arange(args.batch) % models["eager"].num_classes
    fns = {}
    for name, model in models.items():
        fns[f"{name} forward"] = forward_fn(model, x)
        fns[f"{name} training step"] = step_fn(model, x, labels)
    first = {name: timed(fn) for name, fn in fns.items()}  # compiles, where it does
    for name, seconds in first.items():
        print(f"first call {name}: {seconds:.1f} s", flush=True)
    with torch.no_grad():
        eager, compiled = (models[name].eval()(x).logits for name in ("eager", "compile=True"))
    max_diff = float((eager - compiled).abs().max())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(args.repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
            print(f"round {round_ + 1} {name}: {times[name][-1]:.2f} s", flush=True)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    rows = [
        "| variant | first call s | median s | eager ÷ this |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds in median.items():
        eager = median[name.replace("compile=True", "eager")]
        rows.append(f"| {name} | {first[name]:.1f} | {seconds:.2f} | {eager / seconds:.2f}× |")
    state = (
        f"{torch.get_num_threads()} thread(s), {os.cpu_count()} cores; torch {torch.__version__}; ViT {args.size}, "
        f"batch {args.batch}, drop, 20 groups, τ 0.2, fp32; largest |logit difference| compiled vs eager {max_diff:.1e}"
    )
    print(state)
    print("\n".join(rows))
    if args.out:
        options = " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out")
        new = not os.path.exists(args.out)
        with open(args.out, "a", encoding="utf-8") as f:
            if new:
                f.write("# `SOP(compile=True)` on the CPU against eager (issue #29)\n")
            f.write(f"\n## `bench/compile_cpu.py {options}`\n\n{state}.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
