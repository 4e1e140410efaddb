"""``sopfast bench``: the authors' algorithm vs ``exact`` vs ``drop``, side by side, on random weights
(:func:`sopfast.benchmark.run_bench`)."""

from __future__ import annotations

import argparse

from ..common import add_common, device
from ..parser import int_at_least

MODELS = ("vit-b16", "vit-small", "bert-base", "bert-base-pair", "cnn")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--model", choices=MODELS, default="vit-small", help="the backbone shape (default: vit-small)")
    p.add_argument("--batch", type=int_at_least(1), default=4, help="inputs per call (default: 4)")
    p.add_argument("--num-groups", type=int_at_least(1), default=20, help="groups per input (default: 20)")
    p.add_argument("--train", action="store_true", help="time a training step instead of a forward")
    p.add_argument("--repeats", type=int_at_least(1), default=3, help="timed runs per variant (default: 3)")
    p.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed runs first (default: 1)")


def run(args: argparse.Namespace) -> int:
    from ...benchmark import run_bench

    print(
        run_bench(
            args.model,
            batch=args.batch,
            groups=args.num_groups,
            train=args.train,
            repeats=args.repeats,
            warmup=args.warmup,
            device=device(args.device),
        )
    )
    return 0
