"""Flags and steps shared by the subcommands: the model source (``--backbone`` …, ``--checkpoint``),
the data (``--data`` …), the device and seed, output paths, and what a command reports."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from .options import add_api_options
from .parser import CLIError, fraction, int_at_least, key_value, positive_float

if TYPE_CHECKING:
    import torch

    from ..adapters.sources import Backbone
    from ..model.sop import SOP

# SOP options that a saved model may take anew when it is loaded (what the checkpoint saves as
# current values): every command that loads a --checkpoint has their flags.
LOAD_OVERRIDES = ("num_groups", "tau", "mode", "deletion", "group_batch_size", "checkpoint_projection")


def add_common(p: argparse.ArgumentParser) -> None:
    """``--config``, ``--device``, ``--seed``: every subcommand has them, with one meaning."""
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda when available)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seeds python, numpy and torch (default: 0)")


def add_model_source(p: argparse.ArgumentParser, need_checkpoint: bool) -> None:
    """Where the frozen backbone (and a saved SOP model) come from."""
    from ..model.sop import SOP

    g = p.add_argument_group("model")
    g.add_argument(
        "--backbone",
        required=True,
        help="Hugging Face directory (save_pretrained), timm:<name> or torchvision:<name> "
        "(with --backbone-weights), or a pickled nn.Module file (with --trust-pickle)",
    )
    g.add_argument(
        "--backbone-weights",
        default=None,
        help="weights for timm:/torchvision: backbones (.safetensors, or .pth read with weights_only)",
    )
    g.add_argument(
        "--backbone-option",
        type=key_value,
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="a constructor argument of a timm:/torchvision: backbone (repeatable: --backbone-option img_size=64)",
    )
    g.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow --backbone to be a pickled nn.Module file (loading it runs its code)",
    )
    g.add_argument("--checkpoint", required=need_checkpoint, help="directory written by SOP.save_pretrained")
    add_api_options(g, SOP.from_pretrained, only=("strict_backbone",))


def add_data(p: argparse.ArgumentParser) -> None:
    """``--data`` and how to read it (built-in names, or your own files)."""
    from ..data.builtin import BUILTIN

    d = p.add_argument_group("data")
    d.add_argument(
        "--data",
        default="fashion-mnist",
        help=f"a built-in dataset ({', '.join(BUILTIN)}), an image folder (ImageFolder layout), a "
        "saved Hugging Face dataset (save_to_disk) or a CSV/TSV/JSONL file or folder",
    )
    d.add_argument("--limit", type=int_at_least(1), default=None, help="use only the first N examples")
    d.add_argument("--image-column", default=None, help="image column (default: image, img, ...)")
    d.add_argument("--text-column", default=None, help="text column (default: text, sentence, sentence1, ...)")
    d.add_argument("--text-pair-column", default=None, help="second text column (default: sentence2 with sentence1)")
    d.add_argument("--label-column", default=None, help="label column (default: label, labels, y, ...)")
    d.add_argument(
        "--holdout",
        type=fraction,
        default=0.1,
        help="fraction held out for validation/test when the data has one split (default 0.1)",
    )
    d.add_argument(
        "--image-size",
        type=int_at_least(1),
        nargs="+",
        default=None,
        metavar="N",
        help="resize images to N (or H W); default: the backbone's input size",
    )
    from ..checks import finite_float

    d.add_argument("--image-mean", type=finite_float, nargs="+", default=None, help="override the normalisation mean")
    d.add_argument("--image-std", type=positive_float, nargs="+", default=None, help="override the normalisation std")
    d.add_argument("--max-length", type=int_at_least(2), default=None, help="max tokens per text (default 128)")


def device(name: str | None) -> torch.device:
    """``--device`` resolved (:func:`sopfast.devices.resolve_device`), its errors naming the flag."""
    from ..devices import resolve_device

    try:
        return resolve_device(name)
    except ValueError as err:
        raise CLIError(f"--{err}") from err


def load_backbone(args: argparse.Namespace) -> Backbone:
    """The frozen backbone of ``--backbone`` (and its weights, options, pickle permission)."""
    from ..adapters.sources import load_backbone as load

    options = dict(args.backbone_option or [])
    return load(args.backbone, args.backbone_weights, args.trust_pickle, options)


def add_load_overrides(p: argparse.ArgumentParser) -> None:
    """Flags for the SOP options a loaded model takes anew (:data:`LOAD_OVERRIDES`)."""
    from ..model.sop import SOP

    g = p.add_argument_group("model options for the loaded model (sopfast.SOP; default: as saved)")
    add_api_options(g, SOP, only=LOAD_OVERRIDES, defaults=dict.fromkeys(LOAD_OVERRIDES))


def load_model(args: argparse.Namespace, backbone: Backbone, overrides: dict[str, Any] | None = None) -> SOP:
    """The SOP model saved in ``--checkpoint`` over ``backbone``, with the given options as overrides."""
    from ..model import SOP

    if not os.path.isdir(args.checkpoint):
        raise CLIError(f"--checkpoint directory not found: {args.checkpoint}")
    if overrides is None:
        overrides = present(args, list(LOAD_OVERRIDES))
    return SOP.from_pretrained(args.checkpoint, backbone.model, strict_backbone=args.strict_backbone, **overrides)


def load_split(args: argparse.Namespace, model: SOP, backbone: Backbone, role: str, limit: int | None):
    """The dataset for ``role`` (train / val / test) of ``--data`` and a line saying which split it is."""
    from ..data.splits import DataOptions, load_split
    from ..data.user_data import Columns

    options = DataOptions(
        columns=Columns(args.image_column, args.text_column, args.text_pair_column, args.label_column),
        train_split=getattr(args, "train_split", None),
        val_split=getattr(args, "val_split", None),
        split=getattr(args, "split", None),
        holdout=args.holdout,
        image_size=args.image_size,
        image_mean=args.image_mean,
        image_std=args.image_std,
        max_length=args.max_length,
    )
    return load_split(args.data, role, model.adapter, backbone, options, limit)


def report(*lines: str) -> None:
    """What the command is about to use, on stderr (stdout stays the command's result)."""
    for line in lines:
        print(f"sopfast: {line}", file=sys.stderr)


def check_output_dir(flag: str, path: str | None) -> None:
    """Fail now (not after the work) when ``path`` cannot be an output directory."""
    if path is None:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise CLIError(f"{flag} {path} exists and is not a directory")
    parent = _existing_parent(path)
    if not os.path.isdir(parent):
        raise CLIError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent if not os.path.isdir(path) else path, os.W_OK):
        raise CLIError(f"{flag} {path} is not writable")


def check_output_file(flag: str, path: str | None) -> None:
    """Fail now when ``path`` cannot be written as a file; create its missing parent folders."""
    if path is None:
        return
    if os.path.isdir(path):
        raise CLIError(f"{flag} {path} is a directory; give a file path")
    parent = os.path.dirname(os.path.abspath(path))
    existing = _existing_parent(parent)
    if not os.path.isdir(existing):
        raise CLIError(f"{flag} {path}: {existing} is not a directory")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise CLIError(f"{flag} {path}: cannot create {parent}: {err}") from err
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CLIError(f"{flag} {path} is not writable")


def _existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def needs(package: str, extra: str, what: str) -> CLIError:
    """The error for a missing optional package."""
    return CLIError(f"{what} needs the '{package}' package: pip install 'sopfast[{extra}]' (or pip install {package})")


def present(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """``{name: value}`` for the ``names`` whose flags were given (not ``None``)."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
