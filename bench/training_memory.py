"""Peak memory and time of one training step: the authors' algorithm vs ``exact`` vs ``drop``, with and
without activation checkpointing of the projection (issue #16).

One training step = forward, the paper's loss, backward, AdamW step, on randomly initialised
weights (m = 20 groups, τ = 0.2, fp32).  The variants take turns (interleaved rounds) so that a
loaded machine slows them alike; peak memory is read in the last round (RSS high-water mark above
the level before the step on the CPU, ``max_memory_allocated`` on CUDA).  Each ``--batches`` value
is one table row per variant; rows are appended to ``--out`` as Markdown.

    python bench/training_memory.py --model vit-b16 --batches 8 32 64
    python bench/training_memory.py --model bert-base-512 --batches 8 --repeats 2

With ``--warmup 0`` (for the slow CPU rows) one ``drop`` step with checkpointing runs first, unmeasured,
so that AdamW's state already exists when the measured steps start.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable

import torch

import sopfast
from sopfast import testing
from sopfast.benchmark import measure_interleaved
from sopfast.model.reference import reference_forward

MODELS = ("vit-b16", "bert-base-512")


def backbone(name: str) -> torch.nn.Module:
    return testing.vit("b16") if name == "vit-b16" else testing.bert("base")


def batch_of(name: str, size: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if name == "vit-b16":
        return (torch.randn(size, 3, 224, 224, generator=g),), torch.randint(0, 1000, (size,), generator=g)
    ids = torch.randint(1000, 30000, (size, 512), generator=g)
    return (ids, torch.ones_like(ids), torch.zeros_like(ids)), torch.randint(0, 2, (size,), generator=g)


def steps(model: sopfast.SOP, args: tuple, labels: torch.Tensor, amp: bool) -> dict[str, Callable[[], None]]:
    """One training step per variant (the checkpointing flag is set inside each step)."""
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-6)
    dtype = torch.bfloat16 if amp else None

    def step(forward: Callable[[], sopfast.SOPOutput], checkpointed: bool) -> Callable[[], None]:
        def run() -> None:
            model.checkpoint_projection = checkpointed
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=dtype, enabled=amp):
                loss = forward().loss(labels)
            loss.backward()
            optimizer.step()

        return run

    variants = {"reference (authors)": step(lambda: reference_forward(model, *args), False)}
    for mode in ("exact", "drop"):
        for checkpointed in (False, True):
            name = f"{mode}{' + checkpointing' if checkpointed else ''}"
            variants[name] = step(lambda mode=mode: model(*args, mode=mode), checkpointed)
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="vit-b16")
    parser.add_argument("--batches", type=int, nargs="+", default=[8])
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds per variant (median)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (selector and top-τ stay fp32)")
    parser.add_argument("--out", default=None, help="append the Markdown rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = sopfast.SOP(backbone(args.model), num_groups=20, tau=0.2, recipe="paper").train()
    rows = []
    for size in args.batches:
        inputs, labels = batch_of(args.model, size)
        variants = steps(model, inputs, labels, args.bf16)
        if args.warmup == 0:
            # One cheap step creates AdamW's state, so that no variant's peak counts that allocation.
            variants["drop + checkpointing"]()
        measured = measure_interleaved(variants, args.repeats, args.warmup, torch.device("cpu"))
        ref_time, ref_mem = measured["reference (authors)"]
        for name, (seconds, peak) in measured.items():
            rows.append(
                f"| {args.model} | {size} | {name} | {seconds:.2f} | {ref_time / seconds:.2f}× | {peak:.0f} | "
                f"{peak / ref_mem:.2f}× |"
            )
            print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(
                f"\n<!-- {platform.processor() or platform.machine()}, torch {torch.__version__}, "
                f"repeats {args.repeats}, warmup {args.warmup}, bf16 {args.bf16} -->\n"
            )
            f.write("| model | batch | variant | s/step | speed-up | peak MiB | memory vs authors |\n")
            f.write("|---|---:|---|---:|---:|---:|---:|\n")
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
