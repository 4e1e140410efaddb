"""The ``sopfast`` command line: ``demo``, ``train``, ``evaluate``, ``explain``, ``bench``, ``convert``, ``theory``.

Every subcommand takes ``--config FILE`` (YAML or JSON with the same keys as the long flags,
dashes or underscores); its values are parsed and checked exactly like flags, and flags given on
the command line win over the file.  Mistakes end with one line on stderr and exit status 2
(``--debug`` shows the traceback instead).

``--backbone`` is a Hugging Face directory (``save_pretrained``), ``timm:<name>`` or
``torchvision:<name>`` with ``--backbone-weights FILE`` (``.safetensors``, or ``.pth`` read with
``weights_only=True``), or a file holding a pickled ``nn.Module`` (``--trust-pickle``).  ``--data``
is a built-in dataset or your own: an image folder, a saved Hugging Face dataset, CSV/JSONL
(:mod:`sopfast.datasets`).  Heavy packages are imported only by the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checks import finite_float

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..model.sop import SOP

DATASETS = ("fashion-mnist", "digits", "tweets")
BUILTIN_MODALITY = {"fashion-mnist": "image", "digits": "image", "tweets": "text"}
WEIGHT_EXTENSIONS = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


class CLIError(Exception):
    """A bad argument, a missing file, unreadable data: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes raise :class:`CLIError` (one line) instead of printing usage;
    ``subcommands`` maps each subcommand to its parser."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.subcommands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        raise CLIError(f"{message} (see '{self.prog} --help')")


# -- argument types ------------------------------------------------------------------------------
def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer ≥ {minimum}, got {value}")
        return value

    parse.__name__ = f"integer ≥ {minimum}"
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


# -- config files ----------------------------------------------------------------------------------
def _load_config(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        raise CLIError(f"--config file not found: {path}")
    if not os.path.isfile(path):
        raise CLIError(f"--config {path} is not a file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise CLIError(f"--config {path} cannot be read: {err}") from err
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise CLIError(f"--config {path} is not valid YAML: {' '.join(str(err).split())}") from err
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CLIError(f"--config {path} is not valid JSON: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CLIError(f"--config {path} must hold a mapping of option names to values, got {type(data).__name__}")
    return data


def _config_tokens(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """The options of config file ``path`` as command-line tokens for ``parser`` (so they are
    parsed and checked like flags); keys are long flags or destinations, dashes or underscores."""
    by_name: dict[str, tuple[argparse.Action, str, bool]] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "config", "debug"):
            continue
        for flag in longs:
            by_name[flag[2:].replace("-", "_")] = (action, flag, True)
        by_name.setdefault(action.dest, (action, longs[0], False))
    tokens, unknown = [], []
    for key, value in _load_config(path).items():
        name = str(key).replace("-", "_")
        if name not in by_name:
            unknown.append(str(key))
            continue
        action, flag, by_flag = by_name[name]
        tokens += _tokens_for(action, flag, by_flag, key, value, path)
    if unknown:
        raise CLIError(f"--config {path}: unknown option(s) {sorted(unknown)}")
    return tokens


def _tokens_for(action: argparse.Action, flag: str, by_flag: bool, key: Any, value: Any, path: str) -> list[str]:
    where = f"--config {path}: {key!r}"
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise CLIError(f"{where} must be true or false, got {value!r}")
        return [flag] if value == (True if by_flag else action.const) else []
    if value is None:
        return []
    if isinstance(value, dict) or isinstance(value, bool):
        raise CLIError(
            f"{where} must be a {'list of values' if action.nargs in ('+', '*') else 'value'}, got {value!r}"
        )
    if isinstance(value, list):
        if action.nargs not in ("+", "*"):
            raise CLIError(f"{where} takes one value, got a list {value!r}")
        if any(isinstance(v, (dict, list, bool)) or v is None for v in value):
            raise CLIError(f"{where} must be a list of plain values, got {value!r}")
        return [flag, *map(str, value)]
    return [f"{flag}={value}"] if action.nargs not in ("+", "*") else [flag, str(value)]


def _split_config(argv: list[str]) -> str | None:
    """The ``--config`` value in ``argv`` (the last one wins), if any."""
    path = None
    for i, token in enumerate(argv):
        if token == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif token.startswith("--config="):
            path = token.split("=", 1)[1]
    return path


# -- devices and output paths ------------------------------------------------------------------------
def _device(name: str | None) -> torch.device:
    """``--device`` resolved (:func:`sopfast.devices.resolve_device`), its errors naming the flag."""
    from ..devices import resolve_device

    try:
        return resolve_device(name)
    except ValueError as err:
        raise CLIError(f"--{err}") from err


def _output_dir(flag: str, path: str | None) -> None:
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


def _output_file(flag: str, path: str | None) -> None:
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


# -- backbones ---------------------------------------------------------------------------------------
@dataclass
class Backbone:
    """A loaded frozen backbone and where it came from (``kind``: hf, timm, torchvision, module)."""

    model: nn.Module
    kind: str
    directory: str | None = None


def _needs(package: str, extra: str, what: str) -> CLIError:
    return CLIError(f"{what} needs the '{package}' package: pip install 'sopfast[{extra}]' (or pip install {package})")


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors`` or a torch file read with ``weights_only=True``."""
    import torch

    if not os.path.isfile(path):
        raise CLIError(f"--backbone-weights file not found: {path}")
    if not path.endswith(WEIGHT_EXTENSIONS):
        raise CLIError(f"--backbone-weights {path}: expected one of {', '.join(WEIGHT_EXTENSIONS)}")
    state: object  # whatever the file holds, checked below
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is the same user mistake
        raise CLIError(f"--backbone-weights {path} cannot be read as weights: {_one_line(err)}") from err
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CLIError(f"--backbone-weights {path} does not hold a state dict of tensors")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def _load_state(model: nn.Module, state: dict, weights: str, name: str) -> nn.Module:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CLIError(f"--backbone-weights {weights} do not fit {name}: {_one_line(err)[:400]}") from err
    return model.eval()


def _timm_backbone(name: str, weights: str) -> nn.Module:
    try:
        import timm
    except ImportError as err:
        raise _needs("timm", "models", "--backbone timm:...") from err
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        raise CLIError(f"--backbone timm:{name}: no such timm model" + (f"; did you mean {close}?" if close else ""))
    state = _read_weights(weights)
    probe: Any = timm.create_model(name, pretrained=False)  # a timm model, read by attribute name
    kwargs: dict[str, Any] = {}
    head = probe.pretrained_cfg.get("classifier", "head")
    head = head[0] if isinstance(head, (tuple, list)) else head
    if f"{head}.weight" in state:
        kwargs["num_classes"] = int(state[f"{head}.weight"].shape[0])
    if type(probe).__name__ == "VisionTransformer":
        kwargs["dynamic_img_size"] = False
        if "pos_embed" in state:
            tokens = int(state["pos_embed"].shape[1]) - (0 if probe.no_embed_class else probe.num_prefix_tokens)
            side = round(tokens**0.5)
            if side * side == tokens:
                kwargs["img_size"] = side * int(probe.patch_embed.patch_size[0])
    return _load_state(timm.create_model(name, pretrained=False, **kwargs), state, weights, f"timm:{name}")


def _torchvision_backbone(name: str, weights: str) -> nn.Module:
    try:
        import torchvision.models as models
    except ImportError as err:
        raise _needs("torchvision", "models", "--backbone torchvision:...") from err
    from torch import nn

    if name not in models.list_models():
        raise CLIError(f"--backbone torchvision:{name}: no such torchvision model")
    state = _read_weights(weights)
    probe = models.get_model(name, weights=None)
    linears = [n for n, m in probe.named_modules() if isinstance(m, nn.Linear)]
    kwargs = {}
    if linears and f"{linears[-1]}.weight" in state:
        kwargs["num_classes"] = int(state[f"{linears[-1]}.weight"].shape[0])
    return _load_state(models.get_model(name, weights=None, **kwargs), state, weights, f"torchvision:{name}")


def _module_file(path: str, trust_pickle: bool) -> nn.Module:
    import torch
    from torch import nn

    if zipfile.is_zipfile(path) and any(n.endswith("constants.pkl") for n in zipfile.ZipFile(path).namelist()):
        raise CLIError(
            f"--backbone {path} is a TorchScript module; SOP hooks the backbone's layers (--feature-layer), which "
            "ScriptModules do not allow. Save the eager module (torch.save(model, file)) and pass --trust-pickle, "
            "or use timm:<name> / torchvision:<name> with --backbone-weights"
        )
    if not trust_pickle:
        raise CLIError(
            f"--backbone {path} is a file: a pickled nn.Module runs code when loaded, so pass --trust-pickle if "
            "you trust it (a state dict needs its architecture: timm:<name> or torchvision:<name> with "
            "--backbone-weights)"
        )
    try:
        module = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # any unreadable file is the same user mistake
        raise CLIError(f"--backbone {path} cannot be loaded: {_one_line(err)}") from err
    if not isinstance(module, nn.Module):
        raise CLIError(
            f"--backbone {path} holds a {type(module).__name__}, not an nn.Module; for a state dict use "
            "timm:<name> or torchvision:<name> with --backbone-weights"
        )
    return module.eval()


def _hf_backbone(path: str) -> nn.Module:
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise CLIError(f"--backbone {path} is not a Hugging Face model directory (no config.json)")
    try:
        import transformers
        from transformers.models.auto import modeling_auto
    except ImportError as err:
        raise _needs("transformers", "models", "--backbone DIR") from err
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise CLIError(f"--backbone {path}: cannot read its config.json: {_one_line(err)}") from err
    auto: type[transformers.AutoModelForImageClassification] | type[transformers.AutoModelForSequenceClassification]
    if config.model_type in modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        auto = transformers.AutoModelForImageClassification
    elif config.model_type in modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        auto = transformers.AutoModelForSequenceClassification
    else:
        raise CLIError(
            f"--backbone {path}: model_type {config.model_type!r} is neither an image nor a sequence classifier"
        )
    transformers.utils.logging.disable_progress_bar()  # errors stay one line; loading takes a moment
    try:
        return auto.from_pretrained(path, local_files_only=True).eval()
    except (OSError, ValueError, RuntimeError) as err:
        raise CLIError(f"--backbone {path} cannot be loaded: {_one_line(err)}") from err


def load_backbone(spec: str, weights: str | None = None, trust_pickle: bool = False) -> Backbone:
    """The frozen backbone named by ``--backbone`` (forms: the module docstring)."""
    prefix, _, name = spec.partition(":")
    if prefix in ("timm", "torchvision") and name:
        if weights is None:
            raise CLIError(f"--backbone {spec} needs --backbone-weights FILE (sopfast never downloads weights)")
        load = _timm_backbone if prefix == "timm" else _torchvision_backbone
        return Backbone(load(name, weights), prefix)
    if weights is not None:
        raise CLIError("--backbone-weights applies to timm:<name> and torchvision:<name> backbones only")
    if os.path.isdir(spec):
        return Backbone(_hf_backbone(spec), "hf", spec)
    if os.path.isfile(spec):
        return Backbone(_module_file(spec, trust_pickle), "module")
    raise CLIError(
        f"--backbone {spec!r} not found: give a Hugging Face directory, timm:<name> or "
        "torchvision:<name> (with --backbone-weights), or a module file"
    )


def _adapter_kwargs(model: nn.Module, feature_layer: str | None) -> dict[str, Any]:
    """``feature_layer`` for CNN backbones (required there, refused elsewhere)."""
    from ..adapters import CNNAdapter, find_adapter_class

    cnn = issubclass(find_adapter_class(model), CNNAdapter)
    if feature_layer is None and cnn:
        raise CLIError(
            "CNN backbones need --feature-layer NAME: the module whose [B, E, h, w] output is the "
            "feature grid (e.g. layer3 for a ResNet)"
        )
    if feature_layer is not None and not cnn:
        raise CLIError(f"--feature-layer applies to CNN backbones only, not {type(model).__name__}")
    if feature_layer is not None and feature_layer not in dict(model.named_modules()):
        raise CLIError(f"--feature-layer {feature_layer!r} is not a module of the backbone")
    return {"feature_layer": feature_layer} if feature_layer else {}


def load_model(args: argparse.Namespace, backbone: Backbone) -> SOP:
    """The SOP model saved in ``--checkpoint`` over ``backbone``."""
    from ..model.checkpoint import load_pretrained

    if not os.path.isdir(args.checkpoint):
        raise CLIError(f"--checkpoint directory not found: {args.checkpoint}")
    return load_pretrained(args.checkpoint, backbone.model)


# -- data --------------------------------------------------------------------------------------------
def load_split(args: argparse.Namespace, model: SOP, backbone: Backbone, role: str, limit: int | None):
    """The dataset for ``role`` (train / val / test) of ``--data``, built-in or your own, and a line
    saying which split it is; its first example is checked to make a batch the model takes."""
    import torch

    from ..data.batches import parse_batch

    dataset, info = _read_split(args, model, backbone, role, limit)
    if len(dataset) == 0:
        raise CLIError(f"--data {args.data}: the {role} split is empty")
    batch = parse_batch(torch.utils.data.default_collate([dataset[0]]))
    if batch.labels is None:
        raise CLIError(f"--data {args.data}: the {role} examples have no labels")
    try:
        model.prepare(**batch.model_inputs())
    except (ValueError, TypeError) as err:
        raise CLIError(f"--data {args.data} ({role}) does not fit the backbone: {err}") from err
    return dataset, info


def _read_split(args: argparse.Namespace, model: SOP, backbone: Backbone, role: str, limit: int | None):
    modality = model.adapter.modality
    if args.data in DATASETS:
        if BUILTIN_MODALITY[args.data] != modality:
            raise CLIError(
                f"--data {args.data} is {BUILTIN_MODALITY[args.data]} data but the backbone is "
                f"a{'n' if modality == 'image' else ''} {modality} model"
            )
        dataset = _builtin_split(args.data, role, limit, backbone.directory)
        return dataset, f"{role} data: {args.data}, {len(dataset)} examples"
    if not os.path.exists(args.data):
        raise CLIError(
            f"--data {args.data!r} is neither a built-in dataset ({', '.join(DATASETS)}) nor an "
            "existing image folder, saved Hugging Face dataset or CSV/JSONL file"
        )
    from ..data import user_data as datasets

    prep = datasets.preprocessing_for(
        model,
        backbone.kind,
        backbone.directory,
        image_size=args.image_size,
        mean=args.image_mean,
        std=args.image_std,
        max_length=args.max_length,
    )
    columns = datasets.Columns(args.image_column, args.text_column, args.text_pair_column, args.label_column)
    split = {"train": getattr(args, "train_split", None), "val": getattr(args, "val_split", None)}.get(
        role, getattr(args, "split", None)
    )
    dataset, name = datasets.load_split(
        args.data, role, prep, columns=columns, split=split, holdout=args.holdout, limit=limit
    )
    return dataset, f"{role} data: {args.data}, split {name}, {len(dataset)} examples"


def _report(*lines: str) -> None:
    """What the command is about to use, on stderr (stdout stays the command's result)."""
    for line in lines:
        print(f"sopfast: {line}", file=sys.stderr)


def _builtin_split(name: str, role: str, limit: int | None, backbone_dir: str | None):
    """A built-in dataset's ``(x, y)`` pairs (images) or dicts (text); validation uses the test split."""
    from ..data import builtin as data

    split = "train" if role == "train" else "test"
    if name == "fashion-mnist":
        return data.load_fashion_mnist(split, limit).dataset()
    if name == "digits":
        train, test = data.load_digits_images().split(1500)
        part = train if split == "train" else test
        return type(part)(part.x[:limit], part.y[:limit], part.classes, part.name).dataset()
    if backbone_dir is None:
        raise CLIError("--data tweets needs a Hugging Face --backbone directory (for its tokenizer)")
    from ..demo.run import tokenize_tweets

    texts, labels = data.load_tweets()
    cut = int(0.9 * len(texts))
    texts, labels = (texts[:cut], labels[:cut]) if split == "train" else (texts[cut:], labels[cut:])
    return tokenize_tweets(texts[:limit], labels[:limit], backbone_dir)


# -- subcommands -------------------------------------------------------------------------------------
def _cmd_demo(args: argparse.Namespace) -> int:
    from ..demo.run import run_demo

    run_demo(task=args.task, out_dir=args.out, quick=args.quick, device=_device(args.device), seed=args.seed)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import sopfast

    from ..training.trainer import TrainConfig, options_from_args, run_cli, seed_everything

    TrainConfig(**options_from_args(args))  # every training option checked before any loading
    seed_everything(args.seed)  # before the model is built: its generator and selector start from the seed
    backbone = _backbone(args)
    if args.checkpoint:
        model = load_model(args, backbone)
    else:
        kwargs = _adapter_kwargs(backbone.model, args.feature_layer)
        modes = sopfast.adapters.find_adapter_class(backbone.model).supported_modes
        mode = args.mode or ("drop" if "drop" in modes else "exact")
        model = sopfast.SOP(backbone.model, num_groups=args.num_groups, tau=args.tau, mode=mode, **kwargs)
    train_data, train_info = load_split(args, model, backbone, "train", args.limit)
    val_data, val_info = load_split(args, model, backbone, "val", args.val_limit)
    _report(train_info, val_info)
    result = run_cli(args, model, train_data, val_data)
    if args.output_dir:
        print(
            f"sopfast: model saved to {os.path.join(args.output_dir, 'last')} (best validation "
            f"{result.best_metric}: {os.path.join(args.output_dir, 'best')})"
        )
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from ..evaluation.evaluate import run_cli

    backbone = _backbone(args)
    model = load_model(args, backbone)
    dataset, info = load_split(args, model, backbone, "test", args.limit)
    _report(info)
    run_cli(args, model, torch.utils.data.DataLoader(dataset, batch_size=args.batch_size))
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from ..demo.run import write_explanations

    backbone = _backbone(args)
    model = load_model(args, backbone)
    dataset, info = load_split(args, model, backbone, "test", args.count)
    _report(info)
    paths = write_explanations(
        model,
        dataset,
        args.out,
        count=args.count,
        device=_device(args.device),
        class_names=getattr(dataset, "classes", None),
    )
    print("\n".join(paths))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..benchmark import run_bench

    print(
        run_bench(
            args.model,
            batch=args.batch,
            groups=args.num_groups,
            train=args.train,
            repeats=args.repeats,
            warmup=args.warmup,
            device=_device(args.device),
        )
    )
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from ..model.authors import from_authors

    if not os.path.isdir(args.authors):
        raise CLIError(f"--authors directory not found: {args.authors}")
    model = from_authors(args.authors, load_backbone(args.backbone).model, tau=args.tau)
    print(model.save_pretrained(args.out))
    return 0


def _cmd_theory(args: argparse.Namespace) -> int:
    from .. import theory

    try:
        import scipy  # noqa: F401 - the bounds are linear programs solved with scipy
    except ImportError as err:
        raise _needs("scipy", "theory", "sopfast theory") from err
    return theory.run_cli(args)


def _backbone(args: argparse.Namespace) -> Backbone:
    return load_backbone(args.backbone, args.backbone_weights, args.trust_pickle)


# -- the parser --------------------------------------------------------------------------------------
def _add_common(p: argparse.ArgumentParser, device: bool = True) -> None:
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    if device:
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda when available)")
    p.add_argument("--seed", type=_int_at_least(0), default=0)


def _add_model_source(p: argparse.ArgumentParser, need_checkpoint: bool) -> None:
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
        "--trust-pickle",
        action="store_true",
        help="allow --backbone to be a pickled nn.Module file (loading it runs its code)",
    )
    g.add_argument("--checkpoint", required=need_checkpoint, help="directory written by SOP.save_pretrained")
    d = p.add_argument_group("data")
    d.add_argument(
        "--data",
        default="fashion-mnist",
        help=f"a built-in dataset ({', '.join(DATASETS)}), an image folder (ImageFolder layout), a "
        "saved Hugging Face dataset (save_to_disk) or a CSV/TSV/JSONL file or folder",
    )
    d.add_argument("--limit", type=_int_at_least(1), default=None, help="use only the first N examples")
    d.add_argument("--image-column", default=None, help="image column (default: image, img, ...)")
    d.add_argument("--text-column", default=None, help="text column (default: text, sentence, sentence1, ...)")
    d.add_argument("--text-pair-column", default=None, help="second text column (default: sentence2 with sentence1)")
    d.add_argument("--label-column", default=None, help="label column (default: label, labels, y, ...)")
    d.add_argument(
        "--holdout",
        type=_fraction,
        default=0.1,
        help="fraction held out for validation/test when the data has one split (default 0.1)",
    )
    d.add_argument(
        "--image-size",
        type=_int_at_least(1),
        nargs="+",
        default=None,
        metavar="N",
        help="resize images to N (or H W); default: the backbone's input size",
    )
    d.add_argument("--image-mean", type=finite_float, nargs="+", default=None, help="override the normalisation mean")
    d.add_argument("--image-std", type=_positive_float, nargs="+", default=None, help="override the normalisation std")
    d.add_argument("--max-length", type=_int_at_least(2), default=None, help="max tokens per text (default 128)")


def build_parser() -> _Parser:
    """The ``sopfast`` parser; building it imports no optional package."""
    parser = _Parser(prog="sopfast", description="Fast Sum-of-Parts self-attributing models.", allow_abbrev=False)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        parser.subcommands[name] = p
        p.set_defaults(handler=handler)
        p.add_argument("--debug", action="store_true", help="show the traceback of an error")
        return p

    p = add("demo", _cmd_demo, "End-to-end run on offline data: train a backbone, train SOP, evaluate, draw.")
    _add_common(p)
    p.add_argument("--task", choices=("image", "text"), default="image")
    p.add_argument("--out", default="sopfast-demo", help="output directory (pictures, checkpoints, results.json)")
    p.add_argument("--quick", action="store_true", help="a much smaller run (about a minute), for smoke tests")

    p = add("train", _cmd_train, "Train a SOP model over a backbone on a built-in dataset or your own data.")
    _add_common(p)
    _add_model_source(p, need_checkpoint=False)
    p.add_argument("--feature-layer", default=None, help="CNN backbones: the module whose output is the feature grid")
    p.add_argument("--num-groups", type=_int_at_least(1), default=20)
    p.add_argument("--tau", type=finite_float, default=0.2)
    p.add_argument("--mode", choices=("exact", "drop"), default=None, help="default: drop where supported, else exact")
    p.add_argument("--train-split", default=None, help="the data's split to train on (default: train)")
    p.add_argument("--val-split", default=None, help="the data's validation split (default: validation, val, test)")
    p.add_argument("--val-limit", type=_int_at_least(1), default=None)
    from ..training.trainer import add_cli_arguments as add_train_arguments

    add_train_arguments(p)
    p.set_defaults(batch_size=32)

    p = add("evaluate", _cmd_evaluate, "Evaluate a trained SOP model (accuracy, fidelity, insertion, deletion …).")
    _add_common(p, device=False)
    _add_model_source(p, need_checkpoint=True)
    p.add_argument("--split", default=None, help="the data's split to evaluate (default: test, validation)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=32)
    from ..evaluation.evaluate import add_cli_arguments as add_evaluate_arguments

    add_evaluate_arguments(p)

    p = add("explain", _cmd_explain, "Write explanation pictures (PNG per image, HTML per text).")
    _add_common(p)
    _add_model_source(p, need_checkpoint=True)
    p.add_argument("--split", default=None, help="the data's split to explain (default: test, validation)")
    p.add_argument("--count", type=_int_at_least(1), default=8, help="how many test examples to explain")
    p.add_argument("--out", default="explanations")

    p = add("bench", _cmd_bench, "Reference vs exact vs drop, side by side, on random weights.")
    _add_common(p)
    p.add_argument(
        "--model", choices=("vit-b16", "vit-small", "bert-base", "bert-base-pair", "cnn"), default="vit-small"
    )
    p.add_argument("--batch", type=_int_at_least(1), default=4)
    p.add_argument("--num-groups", type=_int_at_least(1), default=20)
    p.add_argument("--train", action="store_true", help="time a training step instead of a forward")
    p.add_argument("--repeats", type=_int_at_least(1), default=3)
    p.add_argument("--warmup", type=_int_at_least(0), default=1)

    p = add("convert", _cmd_convert, "Convert an authors' SOP checkpoint (exlib SOPImageCls) to sopfast's format.")
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    p.add_argument("--authors", required=True, help="the authors' checkpoint directory (config.json + weights)")
    p.add_argument("--backbone", required=True, help="the frozen backbone, a Hugging Face directory")
    p.add_argument("--out", required=True, help="output directory (SOP.save_pretrained format)")
    p.add_argument("--tau", type=finite_float, default=0.2, help="the authors' k: fraction of features per group")

    p = add("theory", _cmd_theory, "Lower bounds on per-feature SANN error vs the group construction.")
    from .. import theory

    theory.add_cli_arguments(p)
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    return parser


def _check_paths(args: argparse.Namespace) -> None:
    """Output paths and devices, checked before any work starts."""
    if getattr(args, "device", None) is not None:
        _device(args.device)
    command = args.command
    if command in ("demo", "explain", "convert"):
        _output_dir("--out", args.out)
    elif command == "theory":
        _output_file("--out", args.out)
    if command == "train":
        _output_dir("--output-dir", args.output_dir)
        _output_file("--log-file", args.log_file)
    if command == "evaluate":
        _output_file("--output", args.output)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, or 2 after a one-line error on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    parser = build_parser()
    prog = "sopfast"
    try:
        at = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
        if at is not None and argv[at] in parser.subcommands:
            command = argv[at]
            config = _split_config(argv[at + 1 :])
            if config is not None:
                argv = [*argv[: at + 1], *_config_tokens(parser.subcommands[command], config), *argv[at + 1 :]]
            prog = f"sopfast {command}"
        args = parser.parse_args(argv)
        _check_paths(args)
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # every failure is one line (the traceback with --debug)
        if debug:
            raise
        text = _one_line(err)
        if not isinstance(err, (CLIError, ValueError, TypeError, FileNotFoundError, ImportError)):
            text = f"{type(err).__name__}: {text} (rerun with --debug for the traceback)"
        print(f"{prog}: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
