"""``exact`` forward at several groups per backbone call vs the authors' algorithm, interleaved (issue #29).

    python bench/exact_chunk_sweep.py --model b16 --batch 2 --groups-per-call 10,20 --rounds 3

Random weights, m = 20, τ = 0.2, fp32; prints each variant's median seconds and the reference's time
over it (bench/RESULTS.md §1, note ³).  Set ``OMP_NUM_THREADS`` to the thread count to report.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from sopfast import testing
from sopfast.model.reference import reference_forward
from sopfast.model.sop import SOP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="b16", help="a sopfast.testing.VIT_SIZES name")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--groups-per-call", default="10,20", help="comma-separated group_batch_size values")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = SOP(testing.vit(args.model, num_labels=10, seed=None), num_groups=20, tau=0.2, recipe="paper").eval()
    x = torch.randn(args.batch, 3, 224, 224)

    def exact(size: int) -> Callable[[], object]:
        def run() -> object:
            model.group_batch_size = size
            return model(x, mode="exact")

        return run

    fns = {"reference": lambda: reference_forward(model, x)}
    fns.update({f"exact, {g} groups per call": exact(int(g)) for g in args.groups_per_call.split(",")})
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for _ in range(args.rounds):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    reference = statistics.median(times["reference"])
    print(f"ViT {args.model}, batch {args.batch}, {torch.get_num_threads()} thread(s)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name}: {median:.2f} s, reference / this {reference / median:.3f}")


if __name__ == "__main__":
    main()
