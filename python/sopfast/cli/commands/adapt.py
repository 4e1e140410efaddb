"""``sopfast adapt``: fine-tune a copy of a backbone to predict from groups of its features, before SOP.

The copy is saved as a separate backbone (``--output-dir``) with ``sopfast_adaptation.json`` recording
where it came from, the settings and both backbones' accuracy; train SOP on it with ``sopfast train
--backbone OUTPUT_DIR``.  SOP then explains the adapted copy, not the original.  ``--output-dir`` is
checked before anything loads: a folder holding a model only with ``--overwrite``, the backbone's own never.
"""

from __future__ import annotations

import argparse

from ...masking.adapt import adapt_backbone
from ..common import (
    add_common,
    add_data,
    add_model_source,
    check_output_dir,
    device,
    load_adapter_split,
    report,
)
from ..options import add_api_options, api_values
from .train import adapter_flags, bare_backbone

SKIP = ("backbone", "train_data", "val_data", "device", "output_dir", "seed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_model_source(p, need_checkpoint=False)
    add_data(p)
    g = p.add_argument_group("adaptation (sopfast.adapt_backbone)")
    g.add_argument(
        "--output-dir",
        required=True,
        help="where the adapted backbone is saved: a new folder (one holding a model only with --overwrite; the "
        "backbone's own folder never)",
    )
    names = add_api_options(g, adapt_backbone, skip=SKIP, given_only=True)
    p.set_defaults(adapt_names=names, adapter_names=adapter_flags(g))


def run(args: argparse.Namespace) -> int:
    from ...adapters.sources import source_folders
    from ...model.state_files import check_model_folder

    check_output_dir("--output-dir", args.output_dir)
    check_model_folder(
        args.output_dir,
        overwrite=bool(getattr(args, "overwrite", False)),
        inputs=source_folders({"spec": args.backbone, "weights": args.backbone_weights}),
        name="--output-dir",
        flag="--overwrite",
    )
    run_device = device(args.device)
    backbone, adapter, options = bare_backbone(args, "adapt")
    train_data = load_adapter_split(args, adapter, backbone, "train", args.limit).dataset
    val_data = load_adapter_split(args, adapter, backbone, "val", None).dataset
    result = adapt_backbone(
        backbone,
        train_data,
        val_data,
        device=run_device,
        output_dir=args.output_dir,
        seed=args.seed,
        **api_values(args, args.adapt_names),
        **options,
    )
    for line in result.lines():
        report(line)
    report(f"adapted backbone saved to {result.output_dir} (provenance: sopfast_adaptation.json)")
    return 0
