"""Backbone adapters, found by model type (see :mod:`sopfast.adapters.base` for the protocol)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .base import BackboneAdapter
from .cnn import CNNAdapter
from .hf_bert import HFBertAdapter
from .hf_vit import HFViTAdapter
from .timm_vit import TimmViTAdapter

Matcher = Callable[[nn.Module], bool]
_REGISTRY: list[tuple[Matcher, type[BackboneAdapter]]] = []


def register_adapter(matcher: Matcher, adapter_cls: type[BackboneAdapter]) -> None:
    """Make :func:`get_adapter` use ``adapter_cls`` for backbones where ``matcher(backbone)`` holds.

    Registered adapters are tried before the built-in ones, newest first.
    """
    _REGISTRY.insert(0, (matcher, adapter_cls))


def _class_names(model: nn.Module) -> set[str]:
    return {cls.__name__ for cls in type(model).__mro__}


def _is_hf_vit(model: nn.Module) -> bool:
    return "ViTForImageClassification" in _class_names(model)


def _is_hf_bert(model: nn.Module) -> bool:
    return hasattr(model, "bert") and hasattr(model, "classifier") and "PreTrainedModel" in _class_names(model)


def _is_timm_vit(model: nn.Module) -> bool:
    return "VisionTransformer" in _class_names(model) and type(model).__module__.startswith("timm")


def _is_hf_without_head(model: nn.Module) -> bool:
    """A Hugging Face base model (``ViTModel``, ``BertModel`` …): hidden states, no class logits."""
    names = _class_names(model)
    return "PreTrainedModel" in names and type(model).__name__.endswith("Model") and not hasattr(model, "classifier")


def _no_head_error(backbone: nn.Module) -> TypeError:
    name = type(backbone).__name__
    family = name[: -len("Model")]
    return TypeError(
        f"backbone {name} is a Hugging Face base model without a classifier: SOP runs the backbone once per "
        f"group and needs its class logits. Load it with its classification head ({family}ForImageClassification "
        f"or {family}ForSequenceClassification, e.g. AutoModelForImageClassification.from_pretrained(path, "
        "num_labels=C)); class_weights=[C, H] only sets the group selector's queries when the classifier has no "
        "weight to copy"
    )


def _is_cnn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


_BUILTIN: list[tuple[Matcher, type[BackboneAdapter]]] = [
    (_is_hf_vit, HFViTAdapter),
    (_is_hf_bert, HFBertAdapter),
    (_is_timm_vit, TimmViTAdapter),
    (_is_cnn, CNNAdapter),
]


SUPPORTED = (
    "HF ViTForImageClassification, HF BertForSequenceClassification (BERT-style encoders under .bert), "
    "timm VisionTransformer, and CNNs (Conv2d features, give feature_layer=)"
)


def find_adapter_class(backbone: nn.Module) -> type[BackboneAdapter]:
    """The adapter class :func:`get_adapter` would use for ``backbone`` (registered ones first).

    Raises ``TypeError`` naming the backbone's type (and Hugging Face ``model_type``) and the
    supported families when no adapter matches.
    """
    if not isinstance(backbone, nn.Module):
        raise TypeError(f"backbone must be a torch.nn.Module, got {type(backbone).__name__}")
    for matcher, adapter_cls in _REGISTRY:
        if matcher(backbone):
            return adapter_cls
    if _is_hf_without_head(backbone):
        raise _no_head_error(backbone)
    for matcher, adapter_cls in _BUILTIN:
        if matcher(backbone):
            return adapter_cls
    model_type = getattr(getattr(backbone, "config", None), "model_type", None)
    kind = f"{type(backbone).__name__}" + (f" (Hugging Face model_type {model_type!r})" if model_type else "")
    raise TypeError(
        f"no sopfast adapter for backbone type {kind}: supported are {SUPPORTED}. For another model, "
        "subclass sopfast.adapters.BackboneAdapter (see its docstring) and pass adapter=... to sopfast.SOP, "
        "or register it with sopfast.adapters.register_adapter."
    )


def get_adapter(backbone: nn.Module, **kwargs) -> BackboneAdapter:
    """The adapter for ``backbone`` (``kwargs`` go to its constructor, e.g. ``feature_layer`` for CNNs)."""
    adapter_cls = find_adapter_class(backbone)
    return adapter_cls(backbone, **kwargs) if kwargs else adapter_cls(backbone)


__all__ = [
    "BackboneAdapter",
    "CNNAdapter",
    "HFBertAdapter",
    "HFViTAdapter",
    "TimmViTAdapter",
    "find_adapter_class",
    "get_adapter",
    "register_adapter",
]
