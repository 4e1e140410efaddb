"""Saving and loading SOP models and training state.

A pretrained directory holds only what SOP trains — the frozen backbone is the user's and
is identified by a hash instead of being copied:

* ``sop_model.safetensors`` – every parameter and buffer of the SOP module except those
  under ``backbone.`` (the projection copy, the generator, the selector);
* ``sop_config.json`` – ``model.config``, the adapter class name, the sopfast version,
  ``backbone_sha256``, a hash of the backbone's ``state_dict``, and ``backbone_architecture``,
  a description of every backbone module (class, sizes, eps, heads, activation …) and of its
  Hugging Face config — the same weights under another architecture compute something else;
  ``weights``, the dtype and shape of every tensor in the weights file, and ``sha256``, the SHA-256 of
  the weights file and of the config's own entries.

A directory is written all-or-nothing (:func:`~sopfast.model.state_files.write_model_folder`): a new
folder, or one holding an SOP checkpoint, which is replaced; a folder holding another model only with
``overwrite=True``, and never the backbone's own folder.  The training state has a checksum too
(:mod:`sopfast.model.state_files`).

Loading verifies what was recorded (a mismatch names the file), requires every entry the saving
version writes (the checksums from sopfast 0.4 on), refuses a checkpoint of a newer sopfast (major or
minor) and NaN or infinite values.  Checkpoints of sopfast 0.3.0 and older hold no checksums and load
with the other checks.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from torch import nn

from ..adapters.sources import source_folders
from ..checks import check_bool, check_path
from ..devices import module_device
from ..integrity import CHECKSUMS_FROM, check_version, listed, non_finite, sha256_bytes, update_with_tensor
from ..version import __version__
from .config_entries import MUTABLE_CONFIG, absent_options
from .recipes import RECIPES

# the training-state functions, where they always were
from .state_files import CARD_NAME as CARD_NAME
from .state_files import STATE_NAME as STATE_NAME
from .state_files import atomic_save as atomic_save
from .state_files import atomic_write as atomic_write
from .state_files import load_training_state as load_training_state
from .state_files import remove_stale_temp_files as remove_stale_temp_files
from .state_files import save_training_state as save_training_state
from .state_files import write_model_folder

WEIGHTS_NAME = "sop_model.safetensors"
CONFIG_NAME = "sop_config.json"
BACKBONE_PREFIX = "backbone."
_META = ("config", "adapter", "backbone_sha256", "sopfast_version")
# Config entries and module attributes that say where a model came from or which kernel runs it,
# not what it computes.
_NOT_COMPUTATION = frozenset(
    {
        "architectures",
        "id2label",
        "label2id",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "use_return_dict",
        "torchscript",
        "use_cache",
        "name_or_path",
        "fused_attn",
        "kernel_config",
        "inplace",
    }
)


def hash_backbone(backbone: nn.Module) -> str:
    """SHA-256 over the backbone's ``state_dict`` (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(backbone.state_dict().items()):
        digest.update(f"{name}|".encode())
        update_with_tensor(digest, tensor)
    return digest.hexdigest()


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, bool, numbers.Number)) or value is None


def _computes(key: str) -> bool:
    """Whether a module attribute / config entry named ``key`` can change what the frozen backbone
    computes in eval mode (dropout, provenance and kernel choices cannot)."""
    return not key.startswith("_") and "dropout" not in key and key not in _NOT_COMPUTATION


def backbone_architecture(backbone: nn.Module) -> dict[str, dict[str, str]]:
    """What the backbone computes apart from its weights: ``{"modules": {name: class, extra_repr and
    scalar attributes (heads, eps …)}, "config": {scalar entries of its HF config}}``."""
    modules = {}
    for name, module in backbone.named_modules():
        if isinstance(module, nn.Dropout):
            continue
        scalars = sorted(f"{k}={v!r}" for k, v in vars(module).items() if _computes(k) and _scalar(v))
        modules[name or "<root>"] = f"{type(module).__name__}({module.extra_repr()}) {' '.join(scalars)}".strip()
    config = getattr(backbone, "config", None)
    entries = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    return {
        "modules": modules,
        "config": {k: repr(v) for k, v in sorted(entries.items()) if _computes(k) and _scalar(v)},
    }


def architecture_differences(saved: dict[str, dict[str, str]], backbone: nn.Module) -> list[str]:
    """``"name: saved → now"`` for every config entry (present in both) and module that differs."""
    now = backbone_architecture(backbone)
    old_cfg, new_cfg = saved.get("config", {}), now["config"]
    changed = [
        f"config.{k}: {old_cfg[k]} → {new_cfg[k]}"
        for k in sorted(set(old_cfg) & set(new_cfg))
        if old_cfg[k] != new_cfg[k]
    ]
    old_mod, new_mod = saved.get("modules", {}), now["modules"]
    names = sorted(set(old_mod) | set(new_mod))
    return changed + [f"{k}: {old_mod.get(k)} → {new_mod.get(k)}" for k in names if old_mod.get(k) != new_mod.get(k)]


def trainable_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of every entry of ``model.state_dict()`` not under ``backbone.``."""
    return {
        name: t.detach().to("cpu", copy=True).contiguous()
        for name, t in model.state_dict().items()
        if not name.startswith(BACKBONE_PREFIX)
    }


def _kind(dtype: torch.dtype) -> str:
    return (
        "float"
        if dtype.is_floating_point
        else "complex"
        if dtype.is_complex
        else "bool"
        if dtype == torch.bool
        else "integer"
    )


def load_trainable_state_dict(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load ``state`` (from :func:`trainable_state_dict`) into ``model``.

    Only the entries SOP owns (everything outside ``backbone.``) are accepted, each with its
    shape and kind of dtype (float, integer, bool: a float weight stored as integers is refused; fp16 for
    fp32 is cast): a missing, extra, reshaped or retyped key — a ``backbone.*`` key above all, which would
    overwrite the caller's frozen backbone — and NaN or infinite values are a ValueError naming ``source``.
    """
    owned = {k: t for k, t in model.state_dict().items() if not k.startswith(BACKBONE_PREFIX)}
    missing = sorted(set(owned) - set(state))
    unexpected = sorted(set(state) - set(owned))
    if missing or unexpected:
        raise ValueError(
            f"{source} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]} "
            "(only the projection, generator and selector are loaded; the backbone is never)"
        )
    reshaped = [
        f"{k} {tuple(state[k].shape)} != {tuple(t.shape)}" for k, t in owned.items() if state[k].shape != t.shape
    ]
    if reshaped:
        raise ValueError(f"{source} does not match the model: shapes differ for {reshaped[:3]}")
    retyped = [
        f"{k} {state[k].dtype} for {t.dtype}" for k, t in owned.items() if _kind(state[k].dtype) != _kind(t.dtype)
    ]
    if retyped:
        raise ValueError(f"{source} does not match the model: dtypes differ for {retyped[:3]} (a corrupted file?)")
    not_finite = non_finite(state)
    if not_finite:
        raise ValueError(
            f"{source} holds NaN or infinite weights in {listed(not_finite)} (saved from a diverged run?); "
            "refusing to load them"
        )
    model.load_state_dict(state, strict=False)


def upgrade_legacy_state(state: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Bring a checkpoint of sopfast 0.1 to the current layout, in place.

    0.1 ranked top-τ ties by the logits (now ``ties="logits"``) and kept one ``[3E, E]``
    generator weight split into ``E/H``-wide heads; with one head that is today's
    ``generator.heads.0``, and a split multi-head model has no equivalent. Late 0.1 development
    builds saved the ``ties`` rule and ``H`` full-width heads stacked as one ``[H, 3E, E]`` weight:
    head ``h`` is ``generator.heads.h``.
    """
    config.setdefault("ties", "logits")
    weight = state.pop("generator.weight", None)
    if weight is not None and weight.dim() == 3:
        state.update({f"generator.heads.{h}": w for h, w in enumerate(weight.unbind(0))})
    elif weight is not None:
        if config.get("num_heads", 1) != 1:
            raise ValueError(
                "this checkpoint (sopfast 0.1) splits one generator weight into E/H-wide heads; "
                "sopfast now keeps H full-width heads as the authors do, so it cannot be loaded"
            )
        state["generator.heads.0"] = weight


def check_provenance(model: Any) -> dict[str, Any]:
    """``model.provenance`` (where the model came from), a TypeError naming it unless it is a dict."""
    if not isinstance(model.provenance, dict):
        raise TypeError(
            f"model.provenance must be a dict (where the model came from), got {model.provenance!r} "
            f"({type(model.provenance).__name__})"
        )
    return model.provenance


def model_config(model: Any, backbone_sha256: str | None = None) -> dict[str, Any]:
    """The JSON config saved beside the weights (``model``: a :class:`sopfast.SOP`)."""
    check_provenance(model)
    config = dict(model.config)
    config.update({key: getattr(model, key) for key in MUTABLE_CONFIG})
    return {
        "config": config,
        "adapter": type(model.adapter).__name__,
        "sopfast_version": __version__,
        "backbone_sha256": backbone_sha256 or model.backbone_sha256(),
        "backbone_architecture": backbone_architecture(model.backbone),
        "provenance": dict(model.provenance),
    }


def _config_sha256(meta: dict[str, Any]) -> str:
    """SHA-256 of a config's entries other than ``sha256`` (canonical JSON)."""
    entries = {k: v for k, v in meta.items() if k != "sha256"}
    return sha256_bytes(json.dumps(entries, sort_keys=True).encode())


def sop_files(model: Any, backbone_sha256: str | None = None) -> dict[str, bytes]:
    """The weights file and the config of ``model`` (a :class:`sopfast.SOP`), by name: what
    :func:`save_pretrained` writes.  NaN or infinite weights are refused (a ValueError naming them): a model
    that cannot predict is not written."""
    state = trainable_state_dict(model)
    not_finite = non_finite(state)
    if not_finite:
        raise ValueError(
            f"refusing to save a model with NaN or infinite weights in {listed(not_finite)} "
            "(it could not predict; a diverged training run?)"
        )
    weights = safetensors_save(state, metadata={"format": "pt"})
    meta = model_config(model, backbone_sha256)
    meta["weights"] = {name: [str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in state.items()}
    try:
        json.dumps(meta)
    except TypeError as err:
        raise TypeError(f"model.config and model.provenance must be JSON-serialisable to save them: {err}") from err
    meta["sha256"] = {WEIGHTS_NAME: sha256_bytes(weights), CONFIG_NAME: _config_sha256(meta)}
    return {WEIGHTS_NAME: weights, CONFIG_NAME: json.dumps(meta, indent=2, sort_keys=True).encode()}


def save_pretrained(
    model: Any,
    directory: str | os.PathLike,
    *,
    backbone_sha256: str | None = None,
    model_card: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Save the trainable parts of ``model`` and its config (and ``model_card`` as ``README.md``) to
    ``directory``, all-or-nothing (:func:`~sopfast.model.state_files.write_model_folder`).

    A new folder, or one holding an SOP checkpoint (replaced), is written; one holding another model only
    with ``overwrite=True`` (its model files replaced), and the backbone's own folder never.
    ``backbone_sha256`` skips re-hashing the backbone when the caller already knows the hash.  NaN or
    infinite weights are refused (a ValueError naming them).
    """
    directory = Path(check_path("directory", directory, directory=True))
    check_bool("overwrite", overwrite)
    files = sop_files(model, backbone_sha256)
    if model_card is not None:
        files[CARD_NAME] = model_card.encode("utf-8")

    def write(folder: Path) -> None:
        for name, data in files.items():
            (folder / name).write_bytes(data)

    inputs = source_folders(model.provenance.get("backbone"), model.backbone)
    write_model_folder(
        directory, write, overwrite=overwrite, inputs=inputs, own=(WEIGHTS_NAME, CONFIG_NAME), name="directory"
    )
    return directory


def pretrained_directory(path: str | os.PathLike) -> Path:
    """``path`` itself when it holds a saved model, else the best (then the last) model of a run folder
    written by :func:`sopfast.train` (``path/best``, ``path/last``)."""
    path = Path(path)
    if (path / CONFIG_NAME).is_file():
        return path
    for name in ("best", "last"):
        if (path / name / CONFIG_NAME).is_file():
            return path / name
    if not path.is_dir():
        raise FileNotFoundError(f"no SOP checkpoint at {path!s}: no such directory")
    if (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"{path!s} is a transformers.Trainer checkpoint without sopfast's files; train with "
            "callbacks=[sopfast.training.hf_trainer.SOPCheckpointCallback()] to make its checkpoints loadable"
        )
    raise FileNotFoundError(
        f"no SOP checkpoint in {path!s}: {CONFIG_NAME} is missing (and it is no run folder with best/ or last/)"
    )


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The saved ``sop_config.json`` of a pretrained directory, checked: valid JSON with every entry
    (the options its version writes too, :func:`sopfast.model.config_entries.absent_options`), a
    ``sopfast_version`` no newer than the installed one (major, minor) and, where recorded, the config's own
    SHA-256 (a ValueError naming the file and what is wrong)."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no SOP checkpoint in {directory!s}: {CONFIG_NAME} is missing")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a valid SOP config (JSON: {err})") from err
    missing = [key for key in _META if not isinstance(meta, dict) or key not in meta]
    if missing or not isinstance(meta["config"], dict):
        raise ValueError(f"{path} is not a valid SOP config: it lacks {missing or ['a config mapping']}")
    version = check_version(meta["sopfast_version"], str(path), __version__)
    recorded = meta.get("sha256")
    if recorded is None and version[:2] >= CHECKSUMS_FROM:
        raise ValueError(
            f"{path} holds no sha256 entry, which sopfast {meta['sopfast_version']} writes into every checkpoint: "
            "its checksums were removed, so it cannot prove itself; save the model again"
        )
    if recorded is not None:
        if (
            not isinstance(recorded, dict)
            or recorded.get(CONFIG_NAME) != _config_sha256(meta)
            or not isinstance(recorded.get(WEIGHTS_NAME), str)
        ):
            raise ValueError(
                f"{path} does not match its recorded SHA-256: the file is corrupted or was edited (to change an "
                "option, pass it to SOP.from_pretrained instead, e.g. tau=0.1)"
            )
    if not isinstance(meta.get("provenance") or {}, dict):
        raise ValueError(f"{path}: provenance is {meta['provenance']!r}, not a mapping: the file is corrupted")
    if absent := absent_options(meta["config"], version):
        raise ValueError(
            f"{path} lacks the config entries {absent} (sopfast {meta['sopfast_version']} writes them all): "
            "the file is incomplete"
        )
    return meta


def _read_weights(path: Path, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of the weights file ``path``, checked against the SHA-256, dtypes and shapes ``meta``
    recorded (a ValueError naming the file)."""
    if not path.is_file():
        raise FileNotFoundError(f"no SOP checkpoint in {path.parent!s}: {WEIGHTS_NAME} is missing")
    data = path.read_bytes()
    expected = (meta.get("sha256") or {}).get(WEIGHTS_NAME)
    if expected is not None and sha256_bytes(data) != expected:
        raise ValueError(
            f"{path} does not match the SHA-256 recorded in {CONFIG_NAME} ({sha256_bytes(data)[:12]}… != "
            f"{expected[:12]}…): the file is corrupted, or was replaced after saving"
        )
    try:
        state = safetensors_load(data)
    except Exception as err:  # safetensors raises its own error type for truncated or corrupt files
        raise ValueError(f"{path} is not a readable safetensors file ({err})") from err
    recorded = meta.get("weights")
    if recorded is not None:
        found = {name: [str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in state.items()}
        differ = sorted(k for k in set(found) | set(recorded) if found.get(k) != recorded.get(k))
        if differ:
            k = differ[0]
            raise ValueError(
                f"{path} does not match the dtypes and shapes recorded in {CONFIG_NAME}: {k} is "
                f"{found.get(k)}, recorded {recorded.get(k)}"
                + (f" ({len(differ) - 1} more differ)" if differ[1:] else "")
            )
    return state


def check_backbone(
    expected: str,
    backbone: nn.Module,
    *,
    strict: bool = True,
    where: str = "checkpoint",
    architecture: dict[str, dict[str, str]] | None = None,
) -> None:
    """Raise ValueError (or warn when not ``strict``) if ``backbone`` is not the one with hash
    ``expected`` and (when saved) the ``architecture`` description."""
    actual = hash_backbone(backbone)
    changed = architecture_differences(architecture, backbone) if architecture else []
    if actual == expected and not changed:
        return
    if actual != expected:
        message = (
            f"the backbone differs from the one the {where} was trained with "
            f"(weights sha256 {actual[:12]}… != {expected[:12]}…)"
        )
    else:
        message = (
            f"the backbone differs from the one the {where} was trained with: same weights, another "
            f"architecture ({'; '.join(changed[:3])})"
        )
    if strict:
        raise ValueError(message + "; pass strict_backbone=False (--no-strict-backbone) to load anyway")
    warnings.warn(message, RuntimeWarning, stacklevel=3)


@dataclass
class Pretrained:
    """A pretrained directory, read and checked against the backbone it is to be loaded over:
    ``options`` for the model's constructor, the trainable ``state``, the ``adapter`` class name."""

    options: dict[str, Any]
    state: dict[str, torch.Tensor]
    adapter: str
    weights_path: Path
    provenance: dict[str, Any]

    def load_into(self, model: nn.Module, adapter_given: bool = False) -> None:
        """Load :attr:`state` into ``model`` (built from :attr:`options`), checking its adapter."""
        adapter = type(model.adapter).__name__
        if not adapter_given and adapter != self.adapter:
            raise ValueError(
                f"the checkpoint was saved with adapter {self.adapter}, but this backbone gets {adapter}; "
                "pass adapter=... to from_pretrained"
            )
        load_trainable_state_dict(model, self.state, source=str(self.weights_path))


def read_pretrained(directory: str | os.PathLike, backbone: nn.Module, *, strict_backbone: bool = True) -> Pretrained:
    """Read ``directory`` (written by :func:`save_pretrained`) for loading over ``backbone``.

    Raises ValueError when ``backbone`` is not the backbone the checkpoint was saved with
    (``strict_backbone=False`` only warns).
    """
    directory = Path(directory)
    meta = read_config(directory)
    weights_path = directory / WEIGHTS_NAME
    check_backbone(
        meta["backbone_sha256"], backbone, strict=strict_backbone, architecture=meta.get("backbone_architecture")
    )
    state = _read_weights(weights_path, meta)
    options = dict(meta["config"])
    options.setdefault("recipe", "paper")  # saved before recipes existed: every option was explicit
    for name, off in RECIPES["paper"].model.items():
        options.setdefault(name, off)  # saved before the option existed: it was off
    upgrade_legacy_state(state, options)
    if "selector.class_queries" in state:
        # The saved queries stand in for a classifier the backbone may not have.
        options["class_weights"] = state["selector.class_queries"].to(module_device(backbone))
    return Pretrained(options, state, meta["adapter"], weights_path, dict(meta.get("provenance") or {}))
