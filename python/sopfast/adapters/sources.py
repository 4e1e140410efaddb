"""Where a frozen backbone comes from: a Hugging Face directory (``save_pretrained``),
``timm:<name>`` or ``torchvision:<name>`` with a local weights file (constructor arguments
allowed), or a file holding a pickled ``nn.Module`` (only when trusted).  sopfast never downloads
weights.  The messages name the command-line flags (``--backbone``, ``--backbone-weights``,
``--trust-pickle``) that the keyword arguments of :func:`load_backbone` mirror.
"""

from __future__ import annotations

import logging
import os
import zipfile
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

WEIGHT_EXTENSIONS = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
SOURCES = ("hf", "timm", "torchvision", "module")
logger = logging.getLogger(__name__)


class BackboneSourceError(ValueError):
    """A backbone that cannot be loaded as given: the message names the source and the flag."""


def one_line(err: BaseException) -> str:
    """An exception's message on one line (its type when it has none)."""
    text = " ".join(str(err).split())
    return text or type(err).__name__


@dataclass
class Backbone:
    """A loaded frozen backbone and where it came from: ``kind`` (hf, timm, torchvision, module),
    the ``spec`` as given, the Hugging Face ``directory``, the ``weights`` file and the constructor
    ``options`` (timm / torchvision) — enough to load it again."""

    model: nn.Module
    kind: str
    spec: str
    directory: str | None = None
    weights: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What :func:`load_backbone` needs to load this backbone again (JSON-serialisable; a pickled
        module is recorded but reloaded only when passed explicitly)."""
        return {"spec": self.spec, "weights": self.weights, "options": dict(self.options), "kind": self.kind}


def _needs(package: str, extra: str, what: str) -> BackboneSourceError:
    return BackboneSourceError(
        f"{what} needs the '{package}' package: pip install 'sopfast[{extra}]' (or pip install {package})"
    )


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors`` or a torch file read with ``weights_only=True``."""
    if not os.path.isfile(path):
        raise BackboneSourceError(f"--backbone-weights file not found: {path}")
    if not path.endswith(WEIGHT_EXTENSIONS):
        raise BackboneSourceError(f"--backbone-weights {path}: expected one of {', '.join(WEIGHT_EXTENSIONS)}")
    state: object  # whatever the file holds, checked below
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is the same user mistake
        raise BackboneSourceError(f"--backbone-weights {path} cannot be read as weights: {one_line(err)}") from err
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BackboneSourceError(f"--backbone-weights {path} does not hold a state dict of tensors")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def _listed(names: list[str], what: str) -> str:
    return f"{len(names)} {what} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"


def _load_state(model: nn.Module, state: dict, weights: str, name: str, hint: str = "") -> nn.Module:
    """Load ``state`` strictly; what does not fit is one line (counts and the first names), then ``hint``."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    reshaped = [
        f"{k} {list(state[k].shape)} in the file, {list(own[k].shape)} in the model"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    parts = [
        _listed(found, what)
        for found, what in ((missing, "weights missing"), (unexpected, "unexpected"), (reshaped, "of another shape"))
        if found
    ]
    if parts:
        raise BackboneSourceError(f"--backbone-weights {weights} do not fit {name}: {'; '.join(parts)}{hint}")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise BackboneSourceError(f"--backbone-weights {weights} do not fit {name}: {one_line(err)[:300]}") from err
    return model.eval()


@dataclass
class _Construction:
    """How a ``timm:`` / ``torchvision:`` model is built for a weights file: ``kwargs`` for its constructor
    (what the weights fix, then the given options), the arguments whose value the weights changed from the
    model's default (``read``), those no weights fix (``open``, with their defaults) and a ``hint`` for errors."""

    kwargs: dict[str, Any]
    read: dict[str, Any]
    open: dict[str, Any]

    @property
    def hint(self) -> str:
        if not self.open:
            return ""
        shown = ", ".join(f"{k}={v}" for k, v in self.open.items())
        flags = " ".join(f"--backbone-option {k}=N" for k in self.open)
        return f"; the weights do not fix {shown} (the model's default): pass {flags} if it was built with another"


def _construction(probe: nn.Module, state: dict, options: dict[str, Any], head_weight: str | None) -> _Construction:
    """The class count read off the weights' head (``head_weight``) and what the probe's adapter reads off
    the weights (a timm ViT's depth, width, patch and image size …), then the given ``options``."""
    from .base import BackboneAdapter
    from .registry import find_adapter_class

    def read(weights: dict) -> dict[str, Any]:
        found = {} if head_weight not in weights else {"num_classes": int(weights[head_weight].shape[0])}
        return {**found, **(adapter.constructor_options(probe, weights) if adapter else {})}

    try:
        adapter: type[BackboneAdapter] | None = find_adapter_class(probe)
    except TypeError:  # no adapter for the probe: SOP says so, with the supported families, later
        adapter = None
    fixed, default = read(state), read(probe.state_dict())
    # what the weights change of the model's default architecture (the class count goes without saying)
    changed = {k: v for k, v in fixed.items() if default.get(k) != v and k not in options and k != "num_classes"}
    open_options = adapter.open_constructor_options(probe) if adapter else {}
    unfixed = {k: v for k, v in open_options.items() if k not in options}
    return _Construction({**fixed, **options}, changed, unfixed)


def _built(
    build: Any,
    probe: nn.Module,
    state: dict,
    options: dict[str, Any],
    weights: str,
    name: str,
    head: str | None,
    by_name: str = "",
) -> nn.Module:
    """The model ``build`` makes for ``state`` (:func:`_construction`), loaded with it; says what it read off
    the weights and what they leave open (``by_name``: what the model's name fixes, said when they do not fit)."""
    plan = _construction(probe, state, options, head)
    if plan.read:
        shown = ", ".join(f"{k}={v}" for k, v in plan.read.items())
        logger.info("%s built as its weights fix it: %s%s", name, shown, plan.hint)
    try:
        model = build(**plan.kwargs)
    except (TypeError, ValueError, AssertionError, RuntimeError) as err:
        given = f" and the constructor arguments {options}" if options else ""
        raise BackboneSourceError(
            f"--backbone {name} cannot be built as its weights{given} make it ({plan.kwargs}): "
            f"{one_line(err)[:200]}{plan.hint}"
        ) from err
    return _load_state(model, state, weights, name, by_name + plan.hint)


def _timm_backbone(name: str, weights: str, options: dict[str, Any]) -> nn.Module:
    try:
        import timm
    except ImportError as err:
        raise _needs("timm", "models", "--backbone timm:...") from err
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise BackboneSourceError(f"--backbone timm:{name}: no such timm model{hint}")
    state = _read_weights(weights)
    build = lambda **kwargs: timm.create_model(name, pretrained=False, **kwargs)
    probe: Any = _created(build, options, f"timm:{name}")
    head = probe.pretrained_cfg.get("classifier", "head")
    head = head[0] if isinstance(head, (tuple, list)) else head
    return _built(build, probe, state, options, weights, f"timm:{name}", f"{head}.weight")


def _torchvision_backbone(name: str, weights: str, options: dict[str, Any]) -> nn.Module:
    try:
        import torchvision.models as models
    except ImportError as err:
        raise _needs("torchvision", "models", "--backbone torchvision:...") from err
    if name not in models.list_models():
        raise BackboneSourceError(f"--backbone torchvision:{name}: no such torchvision model")
    state = _read_weights(weights)
    build = lambda **kwargs: models.get_model(name, weights=None, **kwargs)
    probe = _created(build, options, f"torchvision:{name}")
    linears = [n for n, m in probe.named_modules() if isinstance(m, nn.Linear)]
    head = f"{linears[-1]}.weight" if linears else None
    fixed = f"; torchvision:{name} fixes its depth and width by name: name the torchvision model the weights are of"
    return _built(build, probe, state, options, weights, f"torchvision:{name}", head, fixed)


def _created(build: Any, options: dict[str, Any], name: str) -> nn.Module:
    """``build(**options)``, its errors (an unknown or bad constructor argument) naming the backbone."""
    try:
        return build(**options)
    except (TypeError, ValueError, AssertionError, RuntimeError) as err:
        raise BackboneSourceError(
            f"--backbone {name} does not take the constructor arguments {options}: {one_line(err)[:300]}"
        ) from err


def _module_file(path: str, trust_pickle: bool) -> nn.Module:
    if zipfile.is_zipfile(path) and any(n.endswith("constants.pkl") for n in zipfile.ZipFile(path).namelist()):
        raise BackboneSourceError(
            f"--backbone {path} is a TorchScript module; SOP hooks the backbone's layers (--feature-layer), which "
            "ScriptModules do not allow. Save the eager module (torch.save(model, file)) and pass --trust-pickle, "
            "or use timm:<name> / torchvision:<name> with --backbone-weights"
        )
    if not trust_pickle:
        raise BackboneSourceError(
            f"--backbone {path} is a file: a pickled nn.Module runs code when loaded, so pass --trust-pickle if "
            "you trust it (a state dict needs its architecture: timm:<name> or torchvision:<name> with "
            "--backbone-weights)"
        )
    try:
        module = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # any unreadable file is the same user mistake
        raise BackboneSourceError(f"--backbone {path} cannot be loaded: {one_line(err)}") from err
    if not isinstance(module, nn.Module):
        raise BackboneSourceError(
            f"--backbone {path} holds a {type(module).__name__}, not an nn.Module; for a state dict use "
            "timm:<name> or torchvision:<name> with --backbone-weights"
        )
    return module.eval()


def _hf_backbone(path: str) -> nn.Module:
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise BackboneSourceError(f"--backbone {path} is not a Hugging Face model directory (no config.json)")
    try:
        import transformers
        from transformers.models.auto import modeling_auto
    except ImportError as err:
        raise _needs("transformers", "models", "--backbone DIR") from err
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise BackboneSourceError(f"--backbone {path}: cannot read its config.json: {one_line(err)}") from err
    auto: type[transformers.AutoModelForImageClassification] | type[transformers.AutoModelForSequenceClassification]
    if config.model_type in modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        auto = transformers.AutoModelForImageClassification
    elif config.model_type in modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        auto = transformers.AutoModelForSequenceClassification
    else:
        raise BackboneSourceError(
            f"--backbone {path}: model_type {config.model_type!r} is neither an image nor a sequence classifier"
        )
    transformers.utils.logging.disable_progress_bar()  # errors stay one line; loading takes a moment
    try:
        return auto.from_pretrained(path, local_files_only=True).eval()
    except (OSError, ValueError, RuntimeError) as err:
        raise BackboneSourceError(f"--backbone {path} cannot be loaded: {one_line(err)}") from err


def load_backbone(
    spec: str | os.PathLike,
    weights: str | os.PathLike | None = None,
    trust_pickle: bool = False,
    options: dict[str, Any] | None = None,
) -> Backbone:
    """The frozen backbone named by ``spec`` (forms: the module docstring); ``options`` are constructor
    arguments of a ``timm:`` / ``torchvision:`` model (``{"img_size": 64, "depth": 6}``)."""
    spec = os.fspath(spec)
    weights = None if weights is None else os.fspath(weights)
    options = dict(options or {})
    prefix, _, name = spec.partition(":")
    if prefix in ("timm", "torchvision") and name:
        if weights is None:
            raise BackboneSourceError(
                f"--backbone {spec} needs --backbone-weights FILE (sopfast never downloads weights)"
            )
        load = _timm_backbone if prefix == "timm" else _torchvision_backbone
        model = load(name, weights, options)
        return Backbone(model, prefix, spec, weights=os.path.abspath(weights), options=options)
    if weights is not None:
        raise BackboneSourceError("--backbone-weights applies to timm:<name> and torchvision:<name> backbones only")
    if options:
        raise BackboneSourceError(
            f"constructor arguments {options} (--backbone-option) apply to timm:<name> and torchvision:<name> only"
        )
    if os.path.isdir(spec):
        return Backbone(_hf_backbone(spec), "hf", os.path.abspath(spec), directory=spec)
    if os.path.isfile(spec):
        return Backbone(_module_file(spec, trust_pickle), "module", os.path.abspath(spec))
    raise BackboneSourceError(
        f"--backbone {spec!r} not found: give a Hugging Face directory, timm:<name> or "
        "torchvision:<name> (with --backbone-weights), or a module file"
    )


def inferred_source(model: nn.Module) -> dict[str, Any] | None:
    """Where a backbone built outside :func:`load_backbone` came from, when it says: a Hugging Face
    model loaded from a local directory (its ``name_or_path``).  ``None`` when unknown."""
    path = getattr(model, "name_or_path", None)
    if isinstance(path, str) and path and os.path.isfile(os.path.join(path, "config.json")):
        return {"spec": os.path.abspath(path), "weights": None, "options": {}, "kind": "hf"}
    return None


def source_folders(source: dict[str, Any] | None, model: nn.Module | None = None) -> list[str]:
    """The existing folders a backbone was loaded from: its Hugging Face directory, its weights' or its
    pickled module's folder (``source``: :meth:`Backbone.describe`), a Hugging Face model's ``name_or_path``."""
    record = source if isinstance(source, dict) else {}
    paths = [record.get("spec"), record.get("weights"), getattr(model, "name_or_path", None)]
    return [
        path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        for path in paths
        if isinstance(path, str) and path and os.path.exists(path)
    ]


def load_recorded(source: dict[str, Any], where: str) -> Backbone:
    """The backbone a checkpoint recorded (:meth:`Backbone.describe`); ``where`` names the checkpoint in
    errors, which say to pass the backbone when it cannot be loaded from the record."""
    spec = source.get("spec")
    if not isinstance(spec, str):
        raise BackboneSourceError(f"{where} does not record its backbone; pass the backbone")
    if not (":" in spec or os.path.exists(spec)):
        raise BackboneSourceError(f"{where} records the backbone {spec}, which no longer exists; pass the backbone")
    try:
        return load_backbone(spec, source.get("weights"), options=source.get("options") or {})
    except BackboneSourceError as err:
        raise BackboneSourceError(
            f"{where}: its recorded backbone cannot be loaded ({err}); pass the backbone"
        ) from err
