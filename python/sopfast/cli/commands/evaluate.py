"""``sopfast evaluate``: the paper's evaluation of a trained SOP model (and baselines), as a table
and JSON.  Every keyword of ``sopfast.evaluate`` is a flag, generated from its signature."""

from __future__ import annotations

import argparse
import json
import os

from ...defaults import BATCH_SIZE
from ...evaluation.evaluate import evaluate, format_table
from ...evaluation.plots import plot_curves
from ...evaluation.registry import metric_names
from ...integrity import atomic_write_text
from ..common import (
    add_common,
    add_data,
    add_load_overrides,
    add_model_source,
    check_output_file,
    device,
    load_backbone,
    load_model,
    load_model_split,
)
from ..options import add_api_options, api_values
from ..parser import int_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_model_source(p, need_checkpoint=True)
    add_load_overrides(p)
    add_data(p)
    p.add_argument(
        "--split",
        default=None,
        help="the data's split to evaluate (default: test, else validation, else the test part held out of a "
        "single split; the output names the one used)",
    )
    p.add_argument(
        "--batch-size", type=int_at_least(1), default=BATCH_SIZE, help=f"examples per batch (default: {BATCH_SIZE})"
    )
    g = p.add_argument_group("evaluation (sopfast.evaluate)")
    g.add_argument(
        "--metrics",
        nargs="+",
        choices=metric_names(),  # read when the parser is built: metrics registered before main() are offered
        default=None,
        help="metrics to compute (default: accuracy or mse, fidelity, insertion, deletion, sparsity)",
    )
    g.add_argument(
        "--baselines",
        nargs="+",
        default=None,
        metavar="NAME",
        help="baselines to compare with: 'all' or names of sopfast.baselines.available_baselines()",
    )
    g.add_argument(
        "--ground-truth-key",
        default=None,
        help="dict key (or tuple position) of the ground-truth masks for iou / coverage / object_ratio",
    )
    names = add_api_options(g, evaluate, skip=("device", "print_table"), given_only=True)
    g.add_argument("--output", default=None, help="write the results as JSON to this path")
    g.add_argument(
        "--plot",
        default=None,
        help="write the accuracy curves (metric 'curves') as a PNG to this path (default: beside --output)",
    )
    p.set_defaults(evaluate_names=names)


def _baselines(names: list[str] | None) -> list[str] | str | None:
    """``--baselines all`` as ``"all"``, other names as given."""
    return "all" if names == ["all"] else names


def run(args: argparse.Namespace) -> int:
    import torch

    check_output_file("--output", args.output)
    plot = args.plot or (os.path.splitext(args.output)[0] + "_curves.png" if args.output else None)
    check_output_file("--plot", plot)
    run_device = device(args.device)
    backbone = load_backbone(args)
    model = load_model(args, backbone)
    loaded = load_model_split(args, model, backbone, "test", args.limit, announce=False)  # printed with the table
    dataset = loaded.dataset
    key = args.ground_truth_key
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    if key is None and args.object_masks is not None:
        key = 2  # the (x, y, mask) items of --object-masks
    results = evaluate(
        model,
        torch.utils.data.DataLoader(dataset, batch_size=args.batch_size),
        metrics=args.metrics,
        baselines=_baselines(args.baselines),
        ground_truth_key=key,
        device=run_device,
        **api_values(args, args.evaluate_names),
    )
    for method in results.values():
        method["data"] = loaded.description
    print(f"{loaded.description}\n{format_table(results)}")
    if args.output:
        atomic_write_text(args.output, json.dumps(results, indent=2))
    if plot and any(r.get("curves") for r in results.values()):
        print(f"sopfast: curves written to {plot_curves(results, plot)}")
    return 0
