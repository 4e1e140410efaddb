"""``sopfast demo``: the end-to-end run on offline data (:mod:`sopfast.demo.run`)."""

from __future__ import annotations

import argparse

from ..common import add_common, check_output_dir, device
from ..parser import int_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument(
        "--task",
        choices=("image", "text", "cosmology"),
        default="image",
        help="which demo (default: image; cosmology: a CNN regressing Ω_m and σ_8 from simulated weak-lensing maps)",
    )
    p.add_argument(
        "--out", default="sopfast-demo", help="output directory (report.md, results.json, pictures, checkpoints)"
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--full",
        action="store_true",
        help="the committed study instead of the default run: 2 SOP seeds, every baseline, longer training "
        "(image: about 20 minutes on 2 CPU cores; text: 75-90 minutes beside other jobs)",
    )
    size.add_argument(
        "--quick", action="store_true", help="the full study's every path on small data (a minute or two)"
    )
    p.add_argument(
        "--seeds",
        type=int_at_least(1),
        default=None,
        help="SOP training seeds, reported as mean ± spread (default: 1; --full and --quick: 2)",
    )
    p.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="train the image demo's backbone even when an earlier run kept it (in $SOPFAST_CACHE, else "
        "~/.cache/sopfast)",
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
        full=args.full,
        cache=args.cache,
    )
    return 0
