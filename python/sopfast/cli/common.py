"""Flags and steps shared by the subcommands: the model source (``--backbone`` …, ``--checkpoint``),
the data (``--data`` …), the device and seed, output paths, and what a command reports."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from ..defaults import HOLDOUT, MAX_LENGTH
from .options import add_api_options
from .parser import CLIError, fraction, int_at_least, key_value, positive_float

if TYPE_CHECKING:
    import torch

    from ..adapters import BackboneAdapter
    from ..adapters.sources import Backbone
    from ..data.splits import LoadedSplit
    from ..model.sop import SOP

logger = logging.getLogger("sopfast.cli")
# SOP options that a saved model may take anew when it is loaded (what the checkpoint saves as
# current values): every command that loads a --checkpoint has their flags.
LOAD_OVERRIDES = (
    "num_groups",
    "tau",
    "mode",
    "deletion",
    "demote_blank",
    "group_batch_size",
    "checkpoint_projection",
)
# the data flags a model trained by `sopfast train` records (its provenance["data"]) and a command that
# loads it takes again when they are not given (with the preprocessing, recorded apart)
RECORDED_DATA = ("data", "holdout", "image_column", "text_column", "text_pair_column", "label_column", "label_map")
DEFAULT_DATA = "fashion-mnist"


def add_common(p: argparse.ArgumentParser) -> None:
    """``--config``, ``--device``, ``--seed`` (and ``--verbose``/``--quiet``, which every subcommand
    has): the same meaning everywhere."""
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda when available)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seeds python, numpy and torch (default: 0)")


def add_model_source(p: argparse.ArgumentParser, need_checkpoint: bool) -> None:
    """Where the frozen backbone (and a saved SOP model) come from."""
    from ..model.sop import SOP

    g = p.add_argument_group("model")
    g.add_argument(
        "--backbone",
        help="Hugging Face directory (save_pretrained), timm:<name> or torchvision:<name> "
        "(with --backbone-weights), or a pickled nn.Module file (with --trust-pickle); "
        "default: the one --checkpoint recorded",
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
    g.add_argument(
        "--checkpoint",
        required=need_checkpoint,
        help="a directory written by SOP.save_pretrained, or a run folder of sopfast train (its best/, else last/)",
    )
    add_api_options(g, SOP.from_pretrained, only=("strict_backbone",))


def add_data(p: argparse.ArgumentParser) -> None:
    """``--data`` and how to read it (built-in names, or your own files)."""
    from ..data.builtin import BUILTIN

    d = p.add_argument_group("data")
    d.add_argument(
        "--data",
        default=None,
        help=f"a built-in dataset ({', '.join(BUILTIN)}), an image folder (ImageFolder layout), a folder of .npy "
        "maps with a CSV of their targets (regression), a "
        "saved Hugging Face dataset (save_to_disk) or a CSV/TSV/JSONL file or folder; an existing path wins "
        "over a built-in name, with a warning (default: the data "
        f"--checkpoint was trained on, else the built-in {DEFAULT_DATA})",
    )
    d.add_argument(
        "--limit",
        type=int_at_least(1),
        default=None,
        help="use N examples, taken from every class in turn (the same ones every run)",
    )
    d.add_argument("--image-column", default=None, help="image column (default: image, img, ...)")
    d.add_argument("--text-column", default=None, help="text column (default: text, sentence, sentence1, ...)")
    d.add_argument("--text-pair-column", default=None, help="second text column (default: sentence2 with sentence1)")
    d.add_argument(
        "--label-column",
        default=None,
        help="label column (default: label, labels, y, ...); for a map folder the target columns, a,b (default: "
        "all but file and split)",
    )
    d.add_argument(
        "--label-map",
        type=key_value,
        nargs="+",
        default=None,
        metavar="LABEL=CLASS",
        help="map labels of the data to class ids or class names of the backbone (--label-map cat=0 dog=1; "
        "each label once); labels it leaves out map through the backbone's label2id, and one neither names "
        "is an error; a model trained with it records it (default: the map --checkpoint was trained with)",
    )
    d.add_argument(
        "--holdout",
        type=fraction,
        default=None,
        help="fraction held out of the training split for validation when the data has no validation split "
        f"(and for the test part when it has a single split); default {HOLDOUT}, or what --checkpoint used",
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
    d.add_argument(
        "--max-length", type=int_at_least(2), default=None, help=f"max tokens per text (default {MAX_LENGTH})"
    )
    d.add_argument(
        "--object-masks",
        default=None,
        metavar="SPEC",
        help="object masks for grounding: 'intensity' (pixels brighter than 10%% of white; 'intensity:0.2' "
        "for another threshold) or the column holding a mask image per example",
    )


def device(name: str | None) -> torch.device:
    """``--device`` resolved (:func:`sopfast.devices.resolve_device`), its errors naming the flag."""
    from ..devices import resolve_device

    try:
        return resolve_device(name)
    except ValueError as err:
        raise CLIError(f"--{err}") from err


def load_backbone(args: argparse.Namespace) -> Backbone:
    """The frozen backbone of ``--backbone`` (and its weights, options, pickle permission), or without
    ``--backbone`` the one ``--checkpoint`` recorded."""
    from ..adapters.sources import load_backbone as load
    from ..adapters.sources import load_recorded
    from ..model.checkpoint import pretrained_directory, read_config

    if args.backbone is None:
        directory = pretrained_directory(_existing_checkpoint(args.checkpoint))
        recorded = (read_config(directory).get("provenance") or {}).get("backbone") or {}
        return load_recorded(recorded, f"--checkpoint {args.checkpoint} (give --backbone)")
    options = dict(args.backbone_option or [])
    return load(args.backbone, args.backbone_weights, args.trust_pickle, options)


def _existing_checkpoint(path: str) -> str:
    if not os.path.isdir(path):
        raise CLIError(f"--checkpoint directory not found: {path}")
    return path


def add_load_overrides(p: argparse.ArgumentParser) -> None:
    """Flags for the SOP options a loaded model takes anew (:data:`LOAD_OVERRIDES`)."""
    from ..model.sop import SOP

    g = p.add_argument_group("model options for the loaded model (sopfast.SOP; default: as saved)")
    add_api_options(g, SOP, only=LOAD_OVERRIDES, defaults=dict.fromkeys(LOAD_OVERRIDES))


def load_model(args: argparse.Namespace, backbone: Backbone, overrides: dict[str, Any] | None = None) -> SOP:
    """The SOP model saved in ``--checkpoint`` over ``backbone``, with the given options as overrides."""
    from ..model import SOP

    checkpoint = _existing_checkpoint(args.checkpoint)
    if overrides is None:
        overrides = present(args, list(LOAD_OVERRIDES))
    return SOP.from_pretrained(checkpoint, backbone, strict_backbone=args.strict_backbone, **overrides)


def load_split(args: argparse.Namespace, model: SOP, backbone: Backbone, role: str, limit: int | None):
    """The dataset for ``role`` (train / val / test) of ``--data`` for ``model`` (:func:`load_model_split`)."""
    return load_model_split(args, model, backbone, role, limit).dataset


def load_model_split(
    args: argparse.Namespace,
    model: SOP,
    backbone: Backbone,
    role: str,
    limit: int | None,
    *,
    announce: bool = True,
) -> LoadedSplit:
    """The split for ``role`` (train / val / test) of ``--data`` for ``model``: the data flags not given
    and the preprocessing are the ones the model was trained with, where it records them
    (:func:`resolve_data_flags`); the lines saying which split it is (unless not ``announce``: a command
    that prints it with its result) and which preprocessing it gets are reported, and both are recorded
    with the model (saved with it by ``sopfast train``)."""
    loaded = load_adapter_split(args, model.adapter, backbone, role, limit, model.provenance, announce=announce)
    model.provenance["data"] = {name: getattr(args, name) for name in RECORDED_DATA if getattr(args, name) is not None}
    if loaded.preprocessing is not None:
        model.provenance["preprocessing"] = loaded.preprocessing
    return loaded


def resolve_data_flags(args: argparse.Namespace, saved: dict[str, Any] | None = None) -> None:
    """Fill in the data flags of ``args`` that were not given: from what a model recorded (``saved``: its
    ``provenance``; the columns and ``--holdout`` only with the data it was trained on), else the defaults
    (the built-in Fashion-MNIST, said as a warning).  A path given to ``--data`` becomes absolute.  Each
    choice is reported once: afterwards every flag is set."""
    from ..data.splits import is_builtin

    args.label_map = label_map(args.label_map)
    recorded = dict((saved or {}).get("data") or {})
    whole = getattr(args, "whole_split", False)  # sopfast predict: a single split whole unless --holdout
    if args.data is None or args.data == recorded.get("data"):
        names = [n for n in RECORDED_DATA if not (whole and n == "holdout")]
        taken = {n: recorded[n] for n in names if getattr(args, n) is None and recorded.get(n) is not None}
        for name, value in taken.items():
            setattr(args, name, value)
        if taken:
            shown = ", ".join(f"--{n.replace('_', '-')} {_shown(v)}" for n, v in taken.items())
            report(f"data as the model was trained: {shown} (a flag changes one)")
    elif recorded.get("data"):
        report(f"--data {args.data}: the model was trained on {recorded['data']}")
    if args.data is None:
        args.data = DEFAULT_DATA
        logger.warning(
            "no --data given: using the built-in %s (60,000 training and 10,000 test images; --data names your "
            "own images, texts or a saved dataset)",
            DEFAULT_DATA,
        )
    if args.holdout is None and not whole:
        args.holdout = HOLDOUT
    if not is_builtin(args.data) and os.path.exists(args.data):
        args.data = os.path.abspath(args.data)


def label_map(pairs: Any) -> dict[str, Any] | None:
    """``--label-map``'s ``(label, target)`` pairs (or a recorded mapping) as a mapping: a label given
    twice is a CLIError naming both targets."""
    if pairs is None or isinstance(pairs, dict):
        return pairs
    out: dict[str, Any] = {}
    for label, target in pairs:
        if label in out:
            raise CLIError(
                f"--label-map names {label!r} twice ({label}={json.dumps(out[label])} and "
                f"{label}={json.dumps(target)}): give each label once"
            )
        out[label] = target
    return out


def _shown(value: Any) -> str:
    """A flag's value as typed: a label map as ``NAME=ID`` pairs."""
    if isinstance(value, dict):
        return " ".join(f"{k}={json.dumps(v)}" for k, v in value.items())
    return str(value)


def load_adapter_split(
    args: argparse.Namespace,
    adapter: BackboneAdapter,
    backbone: Backbone,
    role: str,
    limit: int | None,
    saved: dict[str, Any] | None = None,
    *,
    announce: bool = True,
) -> LoadedSplit:
    """:func:`load_model_split` for a bare ``adapter`` (``saved``: what a model recorded, see
    :func:`resolve_data_flags`)."""
    from ..data.object_masks import ObjectMasks
    from ..data.splits import DataOptions, load_split
    from ..data.user_data import Columns

    resolve_data_flags(args, saved)
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
        object_masks=None if args.object_masks is None else ObjectMasks.parse(args.object_masks),
        saved_preprocessing=(saved or {}).get("preprocessing"),
        label_map=args.label_map,
        labels_optional=getattr(args, "labels_optional", False),  # sopfast predict: unlabelled data is fine
    )
    loaded = load_split(args.data, role, adapter, backbone, options, limit)
    if announce:
        report(loaded.description)
    if loaded.preprocessing is not None:
        report(f"{role} preprocessing: {describe_preprocessing(loaded.preprocessing)}")
    return loaded


def describe_preprocessing(prep: dict[str, Any]) -> str:
    """One line for a :meth:`~sopfast.adapters.preprocessing.Preprocessing.describe` record."""
    notes = "; ".join(prep.get("notes") or [])
    if prep["modality"] == "text":
        text = f"tokenizer {prep['tokenizer']}, at most {prep['max_length']} tokens"
    else:
        resize = f"shorter side to {prep['resize_to']}, centre crop " if prep.get("resize_to") else ""
        text = (
            f"{prep.get('library') or 'resize'}: {resize}{'x'.join(map(str, prep['size']))} pixels "
            f"({prep['resample']}), {prep['channels']} channels, mean {prep['mean']}, std {prep['std']}"
        )
    return text + (f" ({notes})" if notes else "")


def report(*lines: str) -> None:
    """What the command is about to use, on stderr (stdout stays the command's result): log records
    of the ``sopfast`` logger at level INFO (``--quiet`` hides them)."""
    for line in lines:
        logger.info(line)


def configure_logging(verbosity: int) -> None:
    """The ``sopfast`` logger writes to stderr as ``sopfast: message`` (warnings marked): INFO by
    default, DEBUG with ``--verbose``, only warnings with ``--quiet`` (``verbosity`` 1, 0, -1).  Under
    ``torchrun`` the processes other than rank 0 write only warnings (the data and report lines once)."""
    root = logging.getLogger("sopfast")
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Format())
    root.addHandler(handler)
    level = {1: logging.DEBUG, 0: logging.INFO, -1: logging.WARNING}[verbosity]
    root.setLevel(level if is_main_process() else max(level, logging.WARNING))
    root.propagate = False


def is_main_process() -> bool:
    """Whether this process is alone or rank 0 of ``torchrun``'s (``RANK``): the one that prints."""
    return int(os.environ.get("RANK", "0")) == 0


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        kind = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"sopfast: {kind}{record.getMessage()}"


def check_output_dir(flag: str, path: str | None) -> None:
    """Fail now (not after the work) when ``path`` cannot be an output directory."""
    if path is None:
        return
    if not path.strip():
        raise CLIError(f"{flag} is empty; give a directory ('.' for the current one)")
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
    if not path.strip():
        raise CLIError(f"{flag} is empty; give a file path")
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
