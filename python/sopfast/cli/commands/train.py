"""``sopfast train``: train an SOP model over a backbone on a built-in dataset or your own data.

Every ``sopfast.SOP`` option, every adapter option (``--feature-layer`` for CNNs) and every
``sopfast.train`` option is a flag, generated from the Python API; a flag that is not given takes
the API's default.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import TYPE_CHECKING

from ...adapters.registry import builtin_adapter_classes
from ...defaults import BATCH_SIZE
from ...model.sop import SOP
from ...training.config import TrainConfig
from ..common import (
    add_common,
    add_data,
    add_model_source,
    check_output_dir,
    check_output_file,
    device,
    is_main_process,
    load_backbone,
    load_model,
    load_split,
    present,
    report,
)
from ..options import add_api_options, api_values, parameters
from ..parser import CLIError, int_at_least

if TYPE_CHECKING:
    from ...adapters import BackboneAdapter
    from ...adapters.sources import Backbone

RUNS_DIR = "runs"  # where a run without --output-dir goes
# sopfast.SOP parameters without a command-line form (tensors; --adapter takes a name)
SOP_SKIP = ("class_weights",)
# TrainConfig fields with flags of their own below (or none: set from --device / --seed)
TRAIN_SKIP = ("resume", "device", "seed")
SOP_OPTIONS = frozenset(name for name in parameters(SOP) if name not in SOP_SKIP)
# the flags a run folder's config.yaml keeps besides the model and training options and the backbone's
# source: the data flags and the model to continue (not kept: --output-dir, --resume-from and --no-resume,
# as a re-run trains anew in a new folder, and --trust-pickle, which each command must be given itself)
RUN_FLAGS = [
    "checkpoint",
    "strict_backbone",
    "data",
    "limit",
    "val_limit",
    "train_split",
    "val_split",
    "holdout",
    "image_column",
    "text_column",
    "text_pair_column",
    "label_column",
    "label_map",
    "image_size",
    "image_mean",
    "image_std",
    "max_length",
    "object_masks",
]


def sop_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The flags of every ``sopfast.SOP`` option (and of the adapters' options)."""
    g = parser.add_argument_group("model options (sopfast.SOP)")
    shown = {"mode": "the recipe's: drop where the backbone supports it for sopfast, exact for paper"}
    names = add_api_options(g, SOP, skip=SOP_SKIP, given_only=True, shown_defaults=shown)
    return names + adapter_flags(g)


def adapter_flags(group: argparse._ArgumentGroup) -> list[str]:
    """The flags of the built-in adapters' options (``--feature-layer`` for CNNs)."""
    names: list[str] = []
    for adapter_cls in builtin_adapter_classes():
        names += add_api_options(
            group, adapter_cls, skip=("backbone",), given_only=True, help_prefix=f"{adapter_cls.family}: "
        )
    return names


def adapter_options(
    args: argparse.Namespace, backbone: Backbone, names: list[str], adapter_cls: type[BackboneAdapter] | None = None
) -> dict:
    """The given adapter flags among ``names``, checked by ``adapter_cls`` (default: the backbone's)."""
    from ...adapters import find_adapter_class

    given = {n: getattr(args, n, None) for n in names if n not in SOP_OPTIONS}
    return (adapter_cls or find_adapter_class(backbone.model)).adapter_options(backbone.model, **given)


def bare_backbone(args: argparse.Namespace, purpose: str) -> tuple[Backbone, BackboneAdapter, dict]:
    """``--backbone`` (required: ``purpose`` says what for) with its adapter built from the adapter flags
    (``args.adapter_names``), for commands that work on a backbone without an SOP model; the adapter's
    options are returned too."""
    from ...adapters import find_adapter_class

    if args.backbone is None:
        raise CLIError(f"give --backbone: the backbone to {purpose}")
    backbone = load_backbone(args)
    options = adapter_options(args, backbone, args.adapter_names)
    return backbone, find_adapter_class(backbone.model)(backbone.model, **options), options


def train_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The flags of every ``sopfast.train`` option (:class:`~sopfast.training.config.TrainConfig`)."""
    g = parser.add_argument_group("training (sopfast.train)")
    names = add_api_options(g, TrainConfig, skip=TRAIN_SKIP, given_only=True, defaults={"batch_size": BATCH_SIZE})
    g.add_argument("--no-resume", dest="resume", action="store_false", help="start afresh in --output-dir")
    g.add_argument("--resume-from", default=None, help="training state file or directory to resume from")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_model_source(p, need_checkpoint=False)
    add_data(p)
    p.add_argument("--train-split", default=None, help="the data's split to train on (default: train)")
    p.add_argument("--val-split", default=None, help="the data's validation split (default: validation, val, test)")
    p.add_argument("--val-limit", type=int_at_least(1), default=None, help="use only the first N validation examples")
    p.set_defaults(sop_names=sop_flags(p), train_names=train_flags(p))


def training_options(args: argparse.Namespace) -> dict:
    """The :func:`sopfast.train` keyword arguments the flags give (unset ones: the API's defaults)."""
    options = api_values(args, args.train_names)
    if args.resume_from is not None and not args.resume:
        raise CLIError("--no-resume and --resume-from contradict each other: give one")
    options.update(device=args.device, seed=args.seed, resume=args.resume_from or args.resume)
    return options


def build_model(args: argparse.Namespace, backbone: Backbone) -> SOP:
    """The ``--checkpoint`` model (the given SOP flags override what it saved), or a new SOP over
    ``backbone`` from the given flags."""
    from ...adapters import adapter_class, find_adapter_class

    sop_options = present(args, [n for n in args.sop_names if n in SOP_OPTIONS])
    if args.checkpoint:
        return load_model(args, backbone, sop_options)
    named = sop_options.get("adapter")
    adapter_cls = adapter_class(named) if named else find_adapter_class(backbone.model)
    return SOP(backbone, **sop_options, **adapter_options(args, backbone, args.sop_names, adapter_cls))


def run(args: argparse.Namespace) -> int:
    from ...training import train
    from ...training.state import seed_everything

    if args.backbone is None and args.checkpoint is None:
        raise CLIError("give --backbone (or --checkpoint, a saved model to train further)")
    check_output_dir("--output-dir", getattr(args, "output_dir", None))
    check_output_file("--log-file", getattr(args, "log_file", None))
    device(args.device)
    options = training_options(args)
    TrainConfig(**options)  # every training option checked before any loading
    seed_everything(args.seed)  # before the model is built: its generator and selector start from the seed
    backbone = load_backbone(args)
    model = build_model(args, backbone)
    train_data = load_split(args, model, backbone, "train", args.limit)
    val_data = load_split(args, model, backbone, "val", args.val_limit)
    if options.get("output_dir") is None:
        options["output_dir"] = default_run_dir(args)
        report(f"the run folder is {options['output_dir']} (--output-dir names another)")
    output_dir = options["output_dir"]
    try:
        result = train(model, train_data, val_data, run_config=run_config(args), **options)
    except KeyboardInterrupt:
        hint = resume_hint(args, output_dir) if is_main_process() else None
        if hint is None:
            raise
        raise KeyboardInterrupt(hint) from None
    if is_main_process():
        print(
            f"sopfast: model saved to {os.path.join(output_dir, 'last')} (best validation "
            f"{result.best_metric}: {os.path.join(output_dir, 'best')})"
        )
    return 0


def resume_hint(args: argparse.Namespace, output_dir: str | os.PathLike) -> str | None:
    """How to continue a run stopped in ``output_dir`` (``None``: it holds no training state)."""
    from ...model.state_files import STATE_NAME

    state = os.path.join(output_dir, STATE_NAME)
    if not os.path.isfile(state):
        return None
    changes = []
    if getattr(args, "output_dir", None) is None:
        changes.append(f"with --output-dir {shlex.quote(str(output_dir))}")
    if args.resume_from is not None:
        changes.append("without --resume-from")
    elif not args.resume:
        changes.append("without --no-resume")
    command = " ".join(["the same command", " and ".join(changes)]).rstrip()
    return f"{command} resumes from the last saved training state ({state})"


def run_config(args: argparse.Namespace) -> dict:
    """The :data:`RUN_FLAGS` given (or filled in from a checkpoint), for ``config.yaml``: paths absolute."""
    given = present(args, RUN_FLAGS)
    if "checkpoint" in given:
        given["checkpoint"] = os.path.abspath(given["checkpoint"])
    else:
        given.pop("strict_backbone", None)  # it applies to a checkpoint only
    return given


def default_run_dir(args: argparse.Namespace, root: str = RUNS_DIR) -> str:
    """``runs/<date>-<time>-<backbone>-<data>`` (as Hugging Face ``Trainer`` and Lightning keep their runs
    under a folder of their own): a new folder for every run, named after what it trains on."""
    import time

    names = [args.backbone or args.checkpoint, args.data]
    parts = [os.path.basename(os.path.normpath(str(n).split(":")[-1])) for n in names if n]
    stem = os.path.join(root, "-".join([time.strftime("%Y%m%d-%H%M%S"), *parts]))
    path, n = stem, 1
    while os.path.exists(path):
        n += 1
        path = f"{stem}-{n}"
    return path
