"""Peak memory of SOP inference vs batch size (issue #14.8): does it stop growing with the batch?

Runs ``model(x)`` under ``torch.no_grad()`` for each mode and batch size and reports the process's
extra peak memory during the call (``sopfast.benchmark.peak_memory_mib``: RSS high-water mark above
the level before the call, heap trimmed first; ``torch.cuda.max_memory_allocated`` on CUDA), with
the inputs already allocated.  Memory is not affected by other load on the machine, unlike time.

    python bench/inference_memory.py                      # ViT-S/16-sized, batches 16 and 128
    python bench/inference_memory.py --batches 16 64 128 --model vit-b16
"""

from __future__ import annotations

import argparse

import torch

import sopfast
from sopfast import testing
from sopfast.benchmark import peak_memory_mib

MODELS = {"vit-s16": "small", "vit-b16": "b16"}


def vit(name: str) -> torch.nn.Module:
    return testing.vit(MODELS[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(MODELS), default="vit-s16")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--modes", nargs="+", default=["exact", "drop"])
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = sopfast.SOP(vit(args.model), num_groups=20, tau=0.2, recipe="paper").eval()
    print(f"| mode | batch | extra peak MiB | × batch {args.batches[0]} |")
    print("|---|---:|---:|---:|")
    for mode in args.modes:
        first = None
        for batch in args.batches:
            x = torch.randn(batch, 3, 224, 224)
            with torch.no_grad():
                peak = peak_memory_mib(lambda: model(x, mode=mode), torch.device("cpu"))  # noqa: B023
            first = first or peak
            print(f"| {mode} | {batch} | {peak:.0f} | {peak / first:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
