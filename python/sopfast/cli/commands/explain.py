"""``sopfast explain``: explanation pictures of a trained SOP model (a PNG per image, an HTML page
per text)."""

from __future__ import annotations

import argparse

from ..common import (
    add_common,
    add_data,
    add_load_overrides,
    add_model_source,
    check_output_dir,
    device,
    load_backbone,
    load_model,
    load_split,
)
from ..parser import int_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_model_source(p, need_checkpoint=True)
    add_load_overrides(p)
    add_data(p)
    p.add_argument("--split", default=None, help="the data's split to explain (default: test, validation)")
    p.add_argument(
        "--count",
        type=int_at_least(1),
        default=8,
        help="how many test examples to explain, taken from every class in turn (default: 8)",
    )
    p.add_argument("--out", default="explanations", help="output directory (default: explanations)")
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="show a progress bar (default: yes)"
    )


def run(args: argparse.Namespace) -> int:
    from ...explain import write_explanations

    check_output_dir("--out", args.out)
    run_device = device(args.device)
    backbone = load_backbone(args)
    model = load_model(args, backbone)
    dataset = load_split(args, model, backbone, "test", args.count)
    paths = write_explanations(
        model,
        dataset,
        args.out,
        count=args.count,
        device=run_device,
        class_names=getattr(dataset, "classes", None),
        progress=args.progress,
    )
    print("\n".join(paths))
    return 0
