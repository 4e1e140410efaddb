"""``sopfast convert``: an authors' SOP checkpoint (exlib ``SOPImageCls``) in sopfast's format
(:meth:`sopfast.SOP.from_authors`, then :meth:`~sopfast.SOP.save_pretrained`)."""

from __future__ import annotations

import argparse
import os

from ..common import check_output_dir
from ..options import add_api_options, api_values
from ..parser import CLIError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ...model.sop import SOP

    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    p.add_argument("--authors", required=True, help="the authors' checkpoint directory (config.json + weights)")
    p.add_argument("--backbone", required=True, help="the frozen backbone, a Hugging Face directory")
    p.add_argument(
        "--out",
        required=True,
        help="output directory (SOP.save_pretrained format): a new folder (one holding a model only with "
        "--overwrite; never --authors' or --backbone's)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the model --out holds")
    g = p.add_argument_group("model options (sopfast.SOP; the authors' k is tau)")
    p.set_defaults(sop_names=add_api_options(g, SOP, only=("tau", "mode", "group_batch_size"), given_only=True))


def run(args: argparse.Namespace) -> int:
    from ...adapters.sources import load_backbone, source_folders
    from ...model import SOP
    from ...model.state_files import check_model_folder

    check_output_dir("--out", args.out)
    if not os.path.isdir(args.authors):
        raise CLIError(f"--authors directory not found: {args.authors}")
    inputs = [args.authors, *source_folders({"spec": args.backbone})]
    check_model_folder(args.out, overwrite=args.overwrite, inputs=inputs, name="--out", flag="--overwrite")
    model = SOP.from_authors(args.authors, load_backbone(args.backbone).model, **api_values(args, args.sop_names))
    print(model.save_pretrained(args.out, overwrite=args.overwrite))
    return 0
