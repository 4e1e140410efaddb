"""Load the authors' SOP checkpoints (BrachioLab ``exlib``: ``SOPImageCls`` / ``SOPTextCls``).

Their checkpoints are Hugging Face ``save_pretrained`` directories: ``config.json`` (``SOPConfig``)
and ``model.safetensors`` or ``pytorch_model.bin`` (read with ``weights_only=True``; sharded
``*.index.json`` layouts too) holding

* ``class_weights [C, E]`` – the selector's class queries;
* ``input_attn.multihead_attns.{h}.input_weights [3E, E]`` – generator head ``h`` (rows
  ``E:2E`` keys, ``2E:3E`` queries; ``output_projection`` is unused);
* ``output_attn.multihead_attn.input_weights [3E, E]`` – the selector (rows ``E:2E`` ``W_K'``,
  ``2E:3E`` ``W_Q'``);
* ``projection.<wrapper>.<backbone name>…`` – the trainable backbone copy, under wrapper
  prefixes that vary (matched by the name after them);
* ``blackbox_model.<wrapper>.<backbone name>…`` – the frozen backbone, which must equal the
  backbone given here.

``config.json`` is what their ``save_pretrained`` writes of a ``PretrainedConfig``: the ``SOPConfig``
keys (absent ones take ``SOPConfig``'s defaults, as their class does), ``id2label`` instead of
``num_labels`` (nothing for 2 labels: the ``class_weights`` rows decide), ``architectures``, the dtype
entry.  Their ``SOP.save`` (``save_to_json`` + ``model.pt``) and training checkpoints
(``checkpoint.pth``, weights under ``"model"``) load too.

Names written by another version of the backbone's library (transformers 4.x's
``vit.encoder.layer.N.attention.attention.query`` …) are mapped to the installed layout by the backbone's
adapter (:meth:`sopfast.adapters.BackboneAdapter.weight_name`).  ``projected_input_scale`` ``s``
multiplies both keys and queries in the authors' generator, so it is folded into γ as ``γ·s²``.
:class:`AuthorsCheckpoint` reads it and :meth:`sopfast.SOP.from_authors` builds the equivalent
:class:`sopfast.SOP` (``ties="authors"``, ``mode="exact"`` unless overridden); ``sopfast convert`` writes
it in sopfast's own format.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..adapters import BackboneAdapter, find_adapter_class
from .checkpoint import load_trainable_state_dict

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt", "checkpoint.pth")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
ARCHITECTURES = ("SOPImageCls", "SOPTextCls")
GENERATOR_HEAD = re.compile(r"^input_attn\.multihead_attns\.(\d+)\.input_weights$")
SELECTOR_WEIGHT = "output_attn.multihead_attn.input_weights"
CLASS_WEIGHTS = "class_weights"
PROJECTION, BLACKBOX = "projection.", "blackbox_model."
# Buffers older transformers saved that hold no weights (recomputed by the model).
_IGNORED_BUFFERS = re.compile(r"(^|\.)position_ids$")


class AuthorsCheckpointError(ValueError):
    """The directory is not a usable authors' SOP checkpoint for this backbone."""


# The authors' ``SOPConfig`` constructor defaults (exlib ``src/exlib/modules/sop.py``).  Their
# ``save_pretrained`` writes a ``PretrainedConfig``: never ``num_labels`` (it becomes ``id2label`` /
# ``label2id``, and nothing at all for 2 labels); hand-edited files may lack any key.
SOPCONFIG_DEFAULTS: dict[str, Any] = {
    "hidden_size": 512,
    "input_hidden_size": None,
    "num_labels": 2,
    "projected_input_scale": 1,
    "num_heads": 1,
    "num_masks_sample": 20,
    "num_masks_max": 200,
    "image_size": [224, 224],
    "num_channels": 3,
    "attn_patch_size": 16,
    "finetune_layers": [],
    "class_weight_layer": None,
    "group_gen_scale": 1,
    "group_sel_scale": 1,
    "group_gen_blur_ks1": -1,
    "group_gen_blur_sigma1": -1,
    "group_gen_blur_ks2": -1,
    "group_gen_blur_sigma2": -1,
    "freeze_projection": False,
}
_NUMBERS = (
    "hidden_size",
    "num_heads",
    "num_masks_sample",
    "projected_input_scale",
    "group_gen_scale",
    "group_sel_scale",
    "group_gen_blur_ks1",
    "group_gen_blur_sigma1",
    "group_gen_blur_ks2",
)
# keys of _NUMBERS that count something (a float such as 2.5 is refused); and those that scale (> 0)
_INTEGERS = ("hidden_size", "num_heads", "num_masks_sample", "group_gen_blur_ks1", "group_gen_blur_ks2")
_POSITIVE = ("hidden_size", "num_heads", "num_masks_sample", "group_gen_scale", "group_sel_scale")


def read_authors_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of an authors' checkpoint with ``SOPConfig``'s defaults filled in for absent keys.

    ``num_labels`` comes from the file if it has one (the authors' own ``save_to_json``), else from
    ``id2label`` (``save_pretrained``), else it is ``None``: the class weights decide
    (:func:`resolve_num_labels`).  ``defaulted`` lists the keys taken from the defaults.
    """
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise AuthorsCheckpointError(f"no authors' SOP checkpoint in {directory}: {CONFIG_FILE} is missing")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise AuthorsCheckpointError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise AuthorsCheckpointError(f"{path} must hold a JSON object (a SOPConfig), got {type(config).__name__}")
    architectures = config.get("architectures") or ["SOPImageCls"]
    if not isinstance(architectures, list) or not set(architectures) & set(ARCHITECTURES):
        raise AuthorsCheckpointError(f"{path}: architectures {architectures} is not one of {list(ARCHITECTURES)}")
    for key in _NUMBERS:
        value = config.get(key, SOPCONFIG_DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise AuthorsCheckpointError(f"{path}: {key} must be a finite number, got {value!r}")
        if key in _INTEGERS and not float(value).is_integer():
            raise AuthorsCheckpointError(f"{path}: {key} must be an integer, got {value!r}")
        if key in _POSITIVE and not value > 0:
            raise AuthorsCheckpointError(f"{path}: {key} must be > 0, got {value!r}")
    if config.get("projected_input_scale", 1) == 0:
        raise AuthorsCheckpointError(
            f"{path}: projected_input_scale must be non-zero (it scales keys and queries), got 0"
        )
    if config.get("group_gen_blur_ks2", -1) > 1:
        warnings.warn(
            f"{path}: group_gen_blur_ks2={config['group_gen_blur_ks2']!r} is ignored: the authors' SOP reads it but "
            "blurs only with group_gen_blur_ks1 (exlib's SOP.__init__), and sopfast does the same",
            UserWarning,
            stacklevel=3,
        )
    num_labels, labels_from = config.get("num_labels"), "num_labels"
    id2label = config.get("id2label")
    if num_labels is None and isinstance(id2label, dict) and id2label:
        num_labels, labels_from = len(id2label), "id2label"
    defaulted = sorted(k for k in SOPCONFIG_DEFAULTS if k not in config and k != "num_labels")
    return {
        **SOPCONFIG_DEFAULTS,
        **config,
        "num_labels": num_labels,
        "num_labels_from": labels_from if num_labels is not None else None,
        "architectures": architectures,
        "defaulted": defaulted,
    }


def resolve_num_labels(config: dict[str, Any], weights: dict[str, torch.Tensor], path: Path) -> int:
    """The number of classes: the config's (``num_labels`` or ``id2label``), checked against the
    ``class_weights`` rows; without either in the config, the class weights' rows."""
    queries = weights.get(CLASS_WEIGHTS)
    if queries is None:
        raise AuthorsCheckpointError(f"the checkpoint lacks {CLASS_WEIGHTS!r} (the selector's [num_labels, E] queries)")
    if queries.dim() != 2:
        raise AuthorsCheckpointError(
            f"{CLASS_WEIGHTS} has shape {tuple(queries.shape)}, expected [num_labels, E] (2 dimensions)"
        )
    rows = int(queries.shape[0])
    declared = config["num_labels"]
    if declared is None:
        return rows
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 1:
        raise AuthorsCheckpointError(f"{path / CONFIG_FILE}: num_labels must be a positive integer, got {declared!r}")
    if declared != rows:
        raise AuthorsCheckpointError(
            f"{path / CONFIG_FILE} declares {declared} labels (its {config['num_labels_from']}) but "
            f"{CLASS_WEIGHTS} has {rows} rows"
        )
    return declared


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors / torch raise their own types for truncated or corrupt files
        raise AuthorsCheckpointError(f"{path} is not a readable weights file ({type(err).__name__}: {err})") from err
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise AuthorsCheckpointError(f"{path} does not hold a state dict of tensors")
    return state


def read_authors_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint (single file or sharded), on the CPU."""
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return _load_file(directory / name)
    for name in INDEX_FILES:
        index = directory / name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in _load_file(directory / shard).items()}
    raise AuthorsCheckpointError(f"no weights in {directory}: expected one of {list(WEIGHT_FILES + INDEX_FILES)}")


Renamer = Callable[[str], str]


def _backbone_name(key: str, names: set[str], rename: Renamer) -> str | None:
    """The backbone state-dict name that ``key`` (wrapper prefixes, maybe another version's names, which
    ``rename`` maps) stands for."""
    parts = key.split(".")
    for start in range(len(parts)):
        candidate = ".".join(parts[start:])
        for name in (candidate, rename(candidate)):
            if name in names:
                return name
    return None


def _check_blackbox(weights: dict[str, torch.Tensor], backbone: nn.Module, rename: Renamer) -> None:
    """The checkpoint's ``blackbox_model`` must be ``backbone``, tensor for tensor."""
    reference = backbone.state_dict()
    covered: set[str] = set()
    for key, tensor in weights.items():
        if not key.startswith(BLACKBOX) or _IGNORED_BUFFERS.search(key):
            continue
        name = _backbone_name(key[len(BLACKBOX) :], set(reference), rename)
        if name is None:
            raise AuthorsCheckpointError(f"the checkpoint's backbone has a weight {key!r} the given backbone lacks")
        expected = reference[name]
        if tensor.shape != expected.shape or not torch.equal(tensor, expected.detach().to("cpu", tensor.dtype)):
            raise AuthorsCheckpointError(
                f"the given backbone is not the checkpoint's: {key!r} differs from the backbone's {name!r} "
                f"(shapes {tuple(tensor.shape)} vs {tuple(expected.shape)})"
            )
        covered.add(name)
    missing = sorted(set(reference) - covered)
    if missing:
        raise AuthorsCheckpointError(f"the checkpoint's blackbox_model lacks backbone weights {missing[:5]}")


def _projection_state(
    weights: dict[str, torch.Tensor], backbone: nn.Module, source: str, rename: Renamer
) -> dict[str, torch.Tensor]:
    """sopfast ``projection.*`` entries from the checkpoint's trainable backbone copy."""
    names = set(backbone.state_dict())
    prefix = f"{source}." if source else ""
    state = {}
    for key, tensor in weights.items():
        if not key.startswith(PROJECTION) or _IGNORED_BUFFERS.search(key):
            continue
        name = _backbone_name(key[len(PROJECTION) :], names, rename)
        if name is None:
            raise AuthorsCheckpointError(f"the checkpoint's projection has a weight {key!r} the backbone lacks")
        if name.startswith(prefix):
            state["projection." + name[len(prefix) :]] = tensor
    return state


def _head_weights(weights: dict[str, torch.Tensor], num_heads: int, embed_dim: int) -> dict[str, torch.Tensor]:
    heads = {int(m.group(1)): t for k, t in weights.items() if (m := GENERATOR_HEAD.match(k))}
    if sorted(heads) != list(range(num_heads)):
        raise AuthorsCheckpointError(
            f"config num_heads={num_heads} but the checkpoint has generator heads {sorted(heads)} "
            "(input_attn.multihead_attns.{h}.input_weights)"
        )
    for h, w in heads.items():
        if tuple(w.shape) != (3 * embed_dim, embed_dim):
            raise AuthorsCheckpointError(
                f"input_attn.multihead_attns.{h}.input_weights has shape {tuple(w.shape)}, "
                f"expected [3E, E] = {(3 * embed_dim, embed_dim)}"
            )
    return {f"generator.heads.{h}": w for h, w in heads.items()}


def _selector_weights(weights: dict[str, torch.Tensor], embed_dim: int, num_labels: int) -> dict[str, torch.Tensor]:
    if SELECTOR_WEIGHT not in weights:
        raise AuthorsCheckpointError(f"the checkpoint lacks {SELECTOR_WEIGHT!r} (the selector's [3E, E] weight)")
    selector, queries = weights[SELECTOR_WEIGHT], weights[CLASS_WEIGHTS]
    if tuple(selector.shape) != (3 * embed_dim, embed_dim):
        raise AuthorsCheckpointError(
            f"{SELECTOR_WEIGHT} has shape {tuple(selector.shape)}, expected [3E, E] = {(3 * embed_dim, embed_dim)}"
        )
    if tuple(queries.shape) != (num_labels, embed_dim):
        raise AuthorsCheckpointError(
            f"{CLASS_WEIGHTS} has shape {tuple(queries.shape)}, expected [num_labels, E] = {(num_labels, embed_dim)}"
        )
    return {
        "selector.class_queries": queries,
        "selector.key_proj.weight": selector[embed_dim : 2 * embed_dim],
        "selector.query_proj.weight": selector[2 * embed_dim :],
    }


def sop_options(config: dict[str, Any]) -> dict[str, Any]:
    """``sopfast.SOP`` keyword arguments equivalent to an authors' ``SOPConfig``."""
    blur = int(config["group_gen_blur_ks1"])
    scale = float(config["projected_input_scale"])
    return {
        "num_groups": int(config["num_masks_sample"]),
        "num_heads": int(config["num_heads"]),
        "group_gen_scale": float(config["group_gen_scale"]) * scale * scale,
        "group_sel_scale": float(config["group_sel_scale"]),
        "blur_kernel_size": blur if blur > 1 else 0,
        "blur_sigma": float(config["group_gen_blur_sigma1"]) if blur > 1 else 1.0,
        "freeze_projection": bool(config["freeze_projection"]),
        "ties": "authors",
        "recipe": "paper",
    }


def _config_value(config: dict[str, Any], key: str) -> str:
    """``key=value`` as the error messages cite it, saying when the value is ``SOPConfig``'s default."""
    note = " (absent from config.json: SOPConfig's default)" if key in config["defaulted"] else ""
    return f"config {key}={config[key]!r}{note}"


def _check_geometry(model: Any, config: dict[str, Any]) -> None:
    adapter = model.adapter
    if config["hidden_size"] != adapter.embed_dim:
        raise AuthorsCheckpointError(
            f"{_config_value(config, 'hidden_size')} but the backbone's embeddings have {adapter.embed_dim}"
        )
    generator_dim = config["input_hidden_size"]
    if generator_dim is not None and generator_dim != adapter.embed_dim:
        raise AuthorsCheckpointError(
            f"config input_hidden_size={generator_dim!r} but the generator reads the backbone copy's "
            f"{adapter.embed_dim}-wide embeddings (sopfast loads checkpoints whose projection is the backbone copy)"
        )
    patch = None if "attn_patch_size" in config["defaulted"] else config["attn_patch_size"]
    patch_size = getattr(adapter, "patch_size", None)
    if patch is not None and patch_size is not None and tuple(patch_size) != (int(patch), int(patch)):
        raise AuthorsCheckpointError(
            f"config attn_patch_size={patch} but the backbone's patches are {tuple(patch_size)}"
        )


class AuthorsCheckpoint:
    """An authors' checkpoint directory, read and checked against the frozen ``backbone`` it is to be
    loaded over: :attr:`options` build the equivalent :class:`sopfast.SOP`, :meth:`load_into` fills it.

    Raises :class:`AuthorsCheckpointError` (a ValueError) naming what does not fit: missing keys,
    wrong shapes, another backbone.
    """

    def __init__(self, directory: str | os.PathLike, backbone: nn.Module):
        self.directory = Path(directory)
        self.config = read_authors_config(self.directory)
        self.weights = read_authors_weights(self.directory)
        self.backbone = backbone
        try:
            self.rename: Renamer = find_adapter_class(backbone).weight_name
        except TypeError:  # no family of sopfast's: the names must be the installed ones
            self.rename = BackboneAdapter.weight_name
        _check_blackbox(self.weights, backbone, self.rename)
        self.options = sop_options(self.config)

    def load_into(self, model: Any) -> None:
        """Load the weights into ``model``, a :class:`sopfast.SOP` over the backbone built from
        :attr:`options` (with any overrides)."""
        _check_geometry(model, self.config)
        if "SOPTextCls" in self.config["architectures"]:
            warnings.warn(
                "SOPTextCls: the authors' public text code does not run as published; the weights load into "
                "sopfast's BERT semantics (top-τ groups, masked tokens → [PAD]), see docs/method.md",
                UserWarning,
                stacklevel=3,
            )
        embed_dim = model.adapter.embed_dim
        num_labels = resolve_num_labels(self.config, self.weights, self.directory)
        state = {
            **_projection_state(self.weights, self.backbone, model.adapter.projection_source, self.rename),
            **_head_weights(self.weights, model.generator.num_heads, embed_dim),
            **_selector_weights(self.weights, embed_dim, num_labels),
        }
        owned = model.state_dict()
        state = {k: v.to(owned[k].dtype) if k in owned else v for k, v in state.items()}
        load_trainable_state_dict(model, state, source=f"authors' checkpoint {self.directory}")
