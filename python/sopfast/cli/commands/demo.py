"""``sopfast demo``: the end-to-end run on offline data (:mod:`sopfast.demo.run`)."""

from __future__ import annotations

import argparse

from ..common import add_common, check_output_dir, device
from ..parser import int_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--task", choices=("image", "text"), default="image", help="which demo (default: image)")
    p.add_argument("--out", default="sopfast-demo", help="output directory (pictures, checkpoints, results.json)")
    p.add_argument("--quick", action="store_true", help="a much smaller run (about a minute), for smoke tests")
    p.add_argument(
        "--seeds",
        type=int_at_least(1),
        default=2,
        help="SOP training seeds (image and text demos), reported as mean ± spread (default: 2)",
    )


def run(args: argparse.Namespace) -> int:
    from ...demo.run import run_demo

    check_output_dir("--out", args.out)
    run_demo(
        task=args.task,
        out_dir=args.out,
        quick=args.quick,
        device=device(args.device),
        seed=args.seed,
        seeds=args.seeds,
    )
    return 0
