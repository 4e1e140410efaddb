"""``sopfast diagnose``: how much of its accuracy a backbone keeps on random groups of its features —
the bound on what SOP can learn over it (``sopfast train`` runs the same check before training).

With ``--checkpoint`` the backbone, its adapter, ``tau``, ``num_groups``, ``mode`` and the data flags
are the ones the saved model records (a flag given wins)."""

from __future__ import annotations

import argparse
from typing import Any

from ...masking.diagnose import diagnose
from ...model.sop import SOP
from ..common import (
    add_common,
    add_data,
    add_model_source,
    check_output_file,
    device,
    load_adapter_split,
    load_backbone,
    load_model,
)
from ..options import add_api_options, api_values, flag
from ..parser import CLIError
from .train import adapter_flags, bare_backbone


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
    shown = {
        "mode": "--checkpoint's, else drop where the backbone supports it, else exact",
        "num_groups": "--checkpoint's, else 20",
        "tau": "--checkpoint's, else 0.2",
    }
    names += add_api_options(g, SOP, only=("num_groups", "tau", "mode"), given_only=True, shown_defaults=shown)
    g.add_argument("--output", default=None, help="write the diagnosis as JSON to this path")
    p.set_defaults(diagnose_names=names, adapter_names=adapter_flags(g))


def measured(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any] | None]:
    """What to measure: ``(backbone, adapter, the object diagnose takes, what a model recorded)`` — the
    ``--backbone`` with the adapter flags, or the ``--checkpoint`` model (its backbone by default)."""
    if args.checkpoint is None:
        if args.backbone is None:
            raise CLIError("give --backbone (the backbone to measure) or --checkpoint (a saved model)")
        backbone, adapter, _ = bare_backbone(args, "measure")
        return backbone, adapter, adapter, None
    given = [flag(n) for n in args.adapter_names if hasattr(args, n)]
    if given:
        raise CLIError(f"{given[0]}: the adapter's options come from --checkpoint {args.checkpoint}")
    backbone = load_backbone(args)
    model = load_model(args, backbone, {})
    return backbone, model.adapter, model, model.provenance


def run(args: argparse.Namespace) -> int:
    check_output_file("--output", args.output)
    run_device = device(args.device)
    backbone, adapter, target, saved = measured(args)
    data = load_adapter_split(args, adapter, backbone, "val", args.limit, saved).dataset
    report = diagnose(target, data, device=run_device, seed=args.seed, **api_values(args, args.diagnose_names))
    print(report)
    if args.output:
        report.save(args.output)
    return 0
