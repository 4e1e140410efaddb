"""Which adapter a backbone gets: user-registered adapters first (newest first), then the built-in
ones, each of which registers itself where its module is defined (:func:`builtin_adapter`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

from .base import BackboneAdapter

Matcher = Callable[[nn.Module], bool]
AdapterClass = TypeVar("AdapterClass", bound=type[BackboneAdapter])
_REGISTERED: list[tuple[Matcher, type[BackboneAdapter]]] = []
_BUILTIN: list[tuple[int, Matcher, type[BackboneAdapter]]] = []


def register_adapter(matcher: Matcher, adapter_cls: type[BackboneAdapter]) -> None:
    """Make :func:`get_adapter` use ``adapter_cls`` for backbones where ``matcher(backbone)`` holds.

    Registered adapters are tried before the built-in ones, newest first.
    """
    _REGISTERED.insert(0, (matcher, adapter_cls))


def builtin_adapter(matcher: Matcher, order: int = 0) -> Callable[[AdapterClass], AdapterClass]:
    """Class decorator of a built-in adapter: tried for backbones where ``matcher`` holds, lower
    ``order`` first (a catch-all family such as CNNs comes last)."""

    def register(adapter_cls: AdapterClass) -> AdapterClass:
        _BUILTIN.append((order, matcher, adapter_cls))
        _BUILTIN.sort(key=lambda entry: entry[0])
        return adapter_cls

    return register


def class_names(model: nn.Module) -> set[str]:
    """The names of ``model``'s class and its bases (families are matched by name: no import needed)."""
    return {cls.__name__ for cls in type(model).__mro__}


def _is_hf_without_head(model: nn.Module) -> bool:
    """A Hugging Face base model (``ViTModel``, ``BertModel`` …): hidden states, no class logits."""
    names = class_names(model)
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


def builtin_adapter_classes() -> list[type[BackboneAdapter]]:
    """The built-in adapter classes, in the order they are tried."""
    return [cls for _, _, cls in _BUILTIN]


def supported() -> str:
    """The built-in families, in words."""
    return "; ".join(cls.family for _, _, cls in _BUILTIN)


def find_adapter_class(backbone: nn.Module) -> type[BackboneAdapter]:
    """The adapter class :func:`get_adapter` would use for ``backbone`` (registered ones first).

    Raises ``TypeError`` naming the backbone's type (and Hugging Face ``model_type``) and the
    supported families when no adapter matches.
    """
    if not isinstance(backbone, nn.Module):
        raise TypeError(f"backbone must be a torch.nn.Module, got {type(backbone).__name__}")
    for matcher, adapter_cls in _REGISTERED:
        if matcher(backbone):
            return adapter_cls
    if _is_hf_without_head(backbone):
        raise _no_head_error(backbone)
    for _, matcher, adapter_cls in _BUILTIN:
        if matcher(backbone):
            return adapter_cls
    model_type = getattr(getattr(backbone, "config", None), "model_type", None)
    kind = f"{type(backbone).__name__}" + (f" (Hugging Face model_type {model_type!r})" if model_type else "")
    raise TypeError(
        f"no sopfast adapter for backbone type {kind}: supported are {supported()}. For another model, "
        "subclass sopfast.adapters.BackboneAdapter (see its docstring) and pass adapter=... to sopfast.SOP, "
        "or register it with sopfast.adapters.register_adapter."
    )


def get_adapter(backbone: nn.Module, **kwargs) -> BackboneAdapter:
    """The adapter for ``backbone`` (``kwargs`` go to its constructor, e.g. ``feature_layer`` for CNNs)."""
    adapter_cls = find_adapter_class(backbone)
    return adapter_cls(backbone, **kwargs) if kwargs else adapter_cls(backbone)
