"""``sopfast predict``: every example of ``--data`` through a trained SOP model (and optionally a
perturbation explainer) into a Parquet dataset in ``--output-dir`` (docs/predict.md).  Every keyword
of ``sopfast.predict`` is a flag, generated from its signature."""

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
    present,
)
from ..options import add_api_options, api_values
from ..parser import key_value


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ...prediction import predict

    add_common(p)
    add_model_source(p, need_checkpoint=True)
    add_load_overrides(p)
    add_data(p)
    p.set_defaults(whole_split=True, labels_optional=True)  # data without labels: null labels
    holdout = next(a for a in p._actions if a.dest == "holdout")
    holdout.help = "predict only this held-out fraction of a single split, as evaluate does (default: all of it)"
    p.add_argument("--split", default=None, help="the data's split (default: test, validation, else the only one)")
    p.add_argument("--output-dir", required=True, help="a new or empty directory, or this run's to resume")
    g = p.add_argument_group("prediction (sopfast.predict)")
    g.add_argument(
        "--explainer-option",
        type=key_value,
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="an option of --explainer (repeatable: --explainer-option num_masks=500)",
    )
    names = add_api_options(
        g, predict, skip=("device", "explainer_options", "ground_truth_key", "description"), given_only=True
    )
    p.set_defaults(predict_names=names)


def run(args: argparse.Namespace) -> int:
    from ...prediction import predict
    from ...prediction.explainers import check_explainer

    check_output_dir("--output-dir", args.output_dir)
    options = check_explainer(getattr(args, "explainer", None), dict(args.explainer_option or []))
    device(args.device)  # a bad --device fails now, naming the flag; predict resolves it per process
    backbone = load_backbone(args)
    model = load_model(args, backbone)
    dataset = load_split(args, model, backbone, "test", args.limit)
    result = predict(
        model,
        dataset,
        args.output_dir,
        device=args.device,
        seed=args.seed,
        explainer_options=options or None,
        description=f"{args.data}" + (f" (split {args.split})" if args.split else ""),
        **present(args, ["mode"]),
        **api_values(args, args.predict_names),
    )
    if result.rank == 0:
        print(result.output_dir)
    return 0
