"""``sopfast diagnose``: how much of its accuracy a backbone keeps on random groups of its features —
the bound on what SOP can learn over it (``sopfast train`` runs the same check before training)."""

from __future__ import annotations

import argparse

from ...model.sop import SOP
from ...training.diagnose import diagnose
from ..common import (
    add_common,
    add_data,
    add_model_source,
    check_output_file,
    device,
    load_adapter_split,
)
from ..options import add_api_options, api_values
from .train import adapter_flags, bare_backbone

NAME = "diagnose"
HELP = "Measure a backbone on whole inputs and on random groups of its features (what SOP can reach)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_model_source(p, need_checkpoint=False)
    add_data(p)
    p.add_argument(
        "--val-split", default=None, help="the split to measure (default: validation, val, test; else a holdout)"
    )
    g = p.add_argument_group("diagnostic (sopfast.diagnose)")
    skip = ("backbone", "data", "device", "seed", "tau", "num_groups", "mode")
    names = add_api_options(g, diagnose, skip=skip, given_only=True)
    shown = {"mode": "drop where the backbone supports it, else exact"}
    names += add_api_options(g, SOP, only=("num_groups", "tau", "mode"), given_only=True, shown_defaults=shown)
    g.add_argument("--output", default=None, help="write the diagnosis as JSON to this path")
    p.set_defaults(diagnose_names=names, adapter_names=adapter_flags(g))


def run(args: argparse.Namespace) -> int:
    check_output_file("--output", args.output)
    run_device = device(args.device)
    backbone, adapter, _ = bare_backbone(args, "measure")
    data = load_adapter_split(args, adapter, backbone, "val", args.limit).dataset
    report = diagnose(adapter, data, device=run_device, seed=args.seed, **api_values(args, args.diagnose_names))
    print(report)
    if args.output:
        report.save(args.output)
    return 0
