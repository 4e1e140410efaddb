"""A ``drop`` training step on saturated logits, with and without subnormal floats flushed in the
backward (``sopfast.model.numerics.flush_denormal``, what ``sopfast.train`` does on the CPU), beside the
authors' algorithm (``reference_forward``) likewise (issue #24, item 6).

The authors' model (``recipe="paper"``, γ = 1) with random weights over a ViT-small-like backbone
(``sopfast.testing.vit("small")``: 384 wide, 6 layers), batch 4, m = 20, τ = 0.2.  At Hugging Face's
initialisation its attention logits are too flat to saturate (std 4.5: no attention value underflows), so
the generator heads are scaled by ``--head-scale`` (γ stays 1; the logits grow by its square), as training
drives them (``docs/quality.md``); the saturation reached is printed.  AdamW runs at lr 0, so every round
sees the same weights.  The variants take turns (interleaved rounds, median of ``--repeats``); run it with
``OMP_NUM_THREADS=1`` (the flag is per thread, ``sopfast.model.numerics``).

    OMP_NUM_THREADS=1 PYTHONPATH=python python bench/denormals.py --out bench/RESULTS_denormals.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

import sopfast
from sopfast import testing
from sopfast.model.numerics import flush_denormal
from sopfast.model.reference import reference_forward

Step = Callable[[], tuple[float, float]]


def saturated_model(head_scale: float, groups: int) -> sopfast.SOP:
    torch.manual_seed(0)
    model = sopfast.SOP(testing.vit("small"), num_groups=groups, tau=0.2, mode="drop", recipe="paper").train()
    with torch.no_grad():
        for head in model.generator.heads:
            head.mul_(head_scale)
    return model


def saturation(model: sopfast.SOP, x: torch.Tensor) -> str:
    """How saturated the generator is, and how many groups flushing the forward too would change."""
    with torch.no_grad():
        inputs = model.prepare(x)
        plain = model.make_groups(inputs)
        with flush_denormal():
            flushed = model.make_groups(inputs)
    a = plain.attention
    subnormal = (a > 0) & (a < torch.finfo(a.dtype).tiny)
    changed = int((plain.mask != flushed.mask).any(dim=-1).sum())
    return (
        f"attention exactly 0: {float((a == 0).float().mean()):.1%}, subnormal: {float(subnormal.float().mean()):.1%}, "
        f"mean λ {float(plain.lam.mean()):.4f}; groups changed if the forward were flushed too: "
        f"{changed} of {plain.mask.shape[0] * plain.mask.shape[1]}"
    )


def steps(model: sopfast.SOP, x: torch.Tensor, labels: torch.Tensor) -> dict[str, Step]:
    """One training step per variant, returning (step seconds, backward seconds)."""
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=0.0)

    def step(forward: Callable[[], sopfast.SOPOutput], flush: bool) -> Step:
        def run() -> tuple[float, float]:
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = forward().compute_loss(labels)
            backward = time.perf_counter()
            with flush_denormal(flush):
                loss.backward()
            backward = time.perf_counter() - backward
            optimizer.step()
            return time.perf_counter() - start, backward

        return run

    return {
        "drop": step(lambda: model(x), False),
        "drop, backward flushed": step(lambda: model(x), True),
        "authors": step(lambda: reference_forward(model, x), False),
        "authors, backward flushed": step(lambda: reference_forward(model, x), True),
    }


def interleaved(variants: dict[str, Step], repeats: int, warmup: int) -> dict[str, tuple[float, float]]:
    """Median (step, backward) seconds of each variant, the variants taking turns in every round."""
    for _ in range(warmup):
        for run in variants.values():
            run()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for round_ in range(repeats):
        for name, run in variants.items():
            times[name].append(run())
            print(f"round {round_ + 1} {name}: {times[name][-1][0]:.2f} s", flush=True)
    return {name: tuple(statistics.median(column) for column in zip(*ts)) for name, ts in times.items()}


def table(measured: dict[str, tuple[float, float]]) -> list[str]:
    rows = [
        "| variant | step vs flushed step | backward vs flushed backward | speed vs the authors' plain step |",
        "|---|---:|---:|---:|",
    ]
    authors = measured["authors"][0]
    for name, (seconds, backward) in measured.items():
        base = measured[name.split(",")[0] + ", backward flushed"]
        rows.append(f"| {name} | {seconds / base[0]:.2f}× | {backward / base[1]:.2f}× | {authors / seconds:.2f}× |")
    return rows


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), with its core count."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores"


def write_results(args: argparse.Namespace, state: str, rows: list[str]) -> None:
    """Append this run's section to ``args.out`` (the title first when the file is new)."""
    options = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out")
    new = not os.path.exists(args.out)
    with open(args.out, "a", encoding="utf-8") as f:
        if new:
            f.write("# Subnormal floats: a drop training step on saturated logits (issue #24, item 6)\n")
        f.write(f"\n## `bench/denormals.py {options}`\n\n{torch.get_num_threads()} thread(s); {cpu_name()}; ")
        f.write(f"torch {torch.__version__}.\n\n{state}.\n\n" + "\n".join(rows) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--head-scale", type=float, default=4.0, help="factor on the generator heads (γ stays 1)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default=None, help="append the Markdown table to this file")
    args = parser.parse_args()
    model = saturated_model(args.head_scale, args.groups)
    g = torch.Generator().manual_seed(1)
    x, labels = torch.randn(args.batch, 3, 224, 224, generator=g), torch.arange(args.batch) % model.num_classes
    state = saturation(model, x)
    print(state, flush=True)
    rows = table(interleaved(steps(model, x, labels), args.repeats, args.warmup))
    print("\n".join(rows))
    if args.out:
        write_results(args, state, rows)


if __name__ == "__main__":
    main()
