"""Which adapter a backbone gets, and adapters by name.

Every adapter has a name (``"hf-vit"``, ``"cnn"`` …; :func:`list_adapters`), by which
``sopfast.SOP(backbone, adapter="hf-deit")`` chooses it.  Without a name the backbone is matched:
adapters registered with :func:`register_adapter` first (newest first), then the built-in families,
each of which registers itself where its module is defined (:func:`builtin_adapter`).  Among the
built-in families the most specific one wins: a *generic* family (the CNN adapter, which runs any
convolutional classifier given a ``feature_layer``) only when no specific family matches, and two
specific families that both match are refused as ambiguous, as is a backbone no family matches —
each message names the candidates.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from ..types import FeatureInputs
from .base import MEASURED_EXACT_MODES, BackboneAdapter, InputsLike, feature_inputs
from .conformance import AdapterCheck, AdapterCheckError, Finding, check_adapter, measure_drop

Matcher = Callable[[nn.Module], bool]
AdapterClass = TypeVar("AdapterClass", bound=type[BackboneAdapter])


@dataclass(frozen=True)
class Entry:
    """One adapter of the registry: its ``name``, class, ``matcher`` and whether it is ``generic``."""

    name: str
    adapter_cls: type[BackboneAdapter]
    matcher: Matcher
    generic: bool = False


_REGISTERED: list[Entry] = []
_BUILTIN: list[Entry] = []


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"an adapter name must be a non-empty string, got {name!r}")
    if name in {e.name for e in _BUILTIN}:
        raise ValueError(f"{name!r} is the name of a built-in adapter; choose another name")
    return name


def register_adapter(
    matcher: Matcher,
    adapter_cls: type[BackboneAdapter],
    name: str | None = None,
    *,
    check_with: tuple[nn.Module, InputsLike] | None = None,
) -> None:
    """Make :func:`get_adapter` use ``adapter_cls`` for backbones where ``matcher(backbone)`` holds, and
    ``adapter=name`` (default: the class name) choose it; it replaces an adapter registered under that
    name before (a built-in name is refused).

    ``check_with=(backbone, example)``: :func:`check` the adapter on one backbone and an example first, and
    refuse it (:class:`~sopfast.adapters.conformance.AdapterCheckError`, the report as message) when it computes
    something else than the backbone; a ``drop = exact`` claim that does not hold only warns (the explainers
    then run ``exact``).  Without it, the claim is measured when an explainer first runs the adapter.

    Registered adapters are tried before the built-in ones, newest first.
    """
    name = _check_name(name or adapter_cls.__name__)
    if check_with is not None:
        _check_registration(matcher, adapter_cls, check_with)
    _REGISTERED[:] = [Entry(name, adapter_cls, matcher), *(e for e in _REGISTERED if e.name != name)]


def _check_registration(matcher: Matcher, adapter_cls: type[BackboneAdapter], check_with: Any) -> None:
    if not (isinstance(check_with, tuple) and len(check_with) == 2 and isinstance(check_with[0], nn.Module)):
        raise TypeError(f"check_with must be a pair (backbone, example), got {type(check_with).__name__}")
    backbone, example = check_with
    if not matcher(backbone):
        raise ValueError(f"check_with: the matcher of {adapter_cls.__name__} does not match {_kind(backbone)}")
    report = check(adapter_cls(backbone), example)
    if report.failed(but=("drop = exact",)):
        raise AdapterCheckError(f"{adapter_cls.__name__} is not registered:\n{report}")
    if not report.ok:
        warnings.warn(f"{adapter_cls.__name__}: {report.failed()[0].detail}", UserWarning, stacklevel=3)


def check(
    adapter_or_model: nn.Module | BackboneAdapter, example: InputsLike, *, tolerance: float | None = None
) -> AdapterCheck:
    """Whether an adapter computes what its backbone computes, on ``example`` (images ``[B, C, H, W]``, a
    mapping of ``input_ids`` / ``attention_mask`` / ``token_type_ids``, or FeatureInputs; one or two examples
    suffice): the full forward, the classifier and feature shapes, the generator embedding, the group passes
    in ``exact`` and a ``drop = exact`` claim (:mod:`sopfast.adapters.conformance`).  ``adapter_or_model``: an
    adapter, an :class:`sopfast.SOP` (its adapter) or a backbone (the adapter it gets).  The measured faithful
    mode is what the explainers of :mod:`sopfast.masking` use from then on.

        report = sopfast.adapters.check(MyAdapter(backbone), images[:2])
        assert report.ok, report           # print(report): one line per comparison
    """
    adapter = adapter_of(adapter_or_model)
    return check_adapter(adapter, feature_inputs(adapter, example), tolerance)


def refuted_drop_claim(adapter: BackboneAdapter, inputs: FeatureInputs) -> Finding | None:
    """Measure an adapter class's ``drop = exact`` claim once, on the first two examples of ``inputs`` (not the
    built-in families', which the test suite measures); the finding when the claim does not hold."""
    cls = type(adapter)
    claimed = "drop" in adapter.exact_modes and "drop" in adapter.supported_modes
    if not claimed or cls in MEASURED_EXACT_MODES or cls in builtin_adapter_classes():
        return None
    finding = measure_drop(adapter, inputs.rows(slice(0, 2)))
    return None if finding.passed else finding


def builtin_adapter(name: str, matcher: Matcher, *, generic: bool = False) -> Callable[[AdapterClass], AdapterClass]:
    """Class decorator of a built-in family called ``name``, matched where ``matcher`` holds; a
    ``generic`` family (a catch-all such as CNNs) only when no specific family matches."""

    def register(adapter_cls: AdapterClass) -> AdapterClass:
        _BUILTIN.append(Entry(_check_name(name), adapter_cls, matcher, generic))
        return adapter_cls

    return register


def list_adapters() -> list[str]:
    """The names ``adapter=`` takes: the registered adapters (newest first), then the built-in families."""
    return [e.name for e in _REGISTERED + _BUILTIN]


def adapter_class(name: str) -> type[BackboneAdapter]:
    """The adapter class called ``name`` (ValueError naming the choices otherwise)."""
    for entry in _REGISTERED + _BUILTIN:
        if entry.name == name:
            return entry.adapter_cls
    raise ValueError(f"adapter {name!r} is not a sopfast adapter; allowed: {', '.join(list_adapters())}")


def class_names(model: nn.Module) -> set[str]:
    """The names of ``model``'s class and its bases (families are matched by name: no import needed)."""
    return {cls.__name__ for cls in type(model).__mro__}


def hf_classifier(*names: str) -> Matcher:
    """A matcher of the Hugging Face classifier classes called ``names`` (or their subclasses)."""
    return lambda model: bool(class_names(model) & set(names)) and "PreTrainedModel" in class_names(model)


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
    """The built-in adapter classes, in the order they registered."""
    return [e.adapter_cls for e in _BUILTIN]


def supported() -> str:
    """The built-in families, in words, with their names."""
    return "; ".join(f"{e.adapter_cls.family} ({e.name!r})" for e in _BUILTIN)


def _kind(backbone: nn.Module) -> str:
    model_type = getattr(getattr(backbone, "config", None), "model_type", None)
    return type(backbone).__name__ + (f" (Hugging Face model_type {model_type!r})" if model_type else "")


def find_adapter_class(backbone: nn.Module) -> type[BackboneAdapter]:
    """The adapter class :func:`get_adapter` would use for ``backbone`` (module docstring).

    Raises ``TypeError`` naming the backbone's type (and Hugging Face ``model_type``) and the candidates
    when no family matches it, or when two specific families do.
    """
    if not isinstance(backbone, nn.Module):
        raise TypeError(f"backbone must be a torch.nn.Module, got {type(backbone).__name__}")
    for entry in _REGISTERED:
        if entry.matcher(backbone):
            return entry.adapter_cls
    if _is_hf_without_head(backbone):
        raise _no_head_error(backbone)
    for generic in (False, True):
        matches = [e for e in _BUILTIN if e.generic == generic and e.matcher(backbone)]
        if len(matches) > 1:
            names = ", ".join(repr(e.name) for e in matches)
            raise TypeError(
                f"backbone type {_kind(backbone)} matches several sopfast adapters ({names}); choose one with "
                f"adapter=NAME (sopfast.SOP(backbone, adapter={matches[0].name!r}))"
            )
        if matches:
            return matches[0].adapter_cls
    raise TypeError(
        f"no sopfast adapter for backbone type {_kind(backbone)}: supported are {supported()}. For another model, "
        "subclass sopfast.adapters.BackboneAdapter (see its docstring) and pass adapter=... to sopfast.SOP, "
        "or register it with sopfast.adapters.register_adapter."
    )


def adapter_of(backbone: nn.Module | BackboneAdapter) -> BackboneAdapter:
    """The adapter of ``backbone``: an adapter itself, an object with ``.adapter`` (an
    :class:`sopfast.SOP`), or a backbone sopfast knows (TypeError otherwise)."""
    if isinstance(backbone, BackboneAdapter):
        return backbone
    adapter = getattr(backbone, "adapter", None)
    if isinstance(adapter, BackboneAdapter):
        return adapter
    if not isinstance(backbone, nn.Module):
        raise TypeError(
            f"backbone must be an nn.Module with a sopfast adapter, an SOP model or a BackboneAdapter, "
            f"got {type(backbone).__name__}"
        )
    return get_adapter(backbone)


def get_adapter(backbone: nn.Module, adapter: str | None = None, **kwargs: Any) -> BackboneAdapter:
    """The adapter for ``backbone``: the one called ``adapter`` (:func:`list_adapters`), else the one it
    matches (:func:`find_adapter_class`); ``kwargs`` go to its constructor (``feature_layer`` for CNNs)."""
    if adapter is None:
        adapter_cls = find_adapter_class(backbone)
        return adapter_cls(backbone, **kwargs)
    if not isinstance(adapter, str):
        raise TypeError(
            f"adapter must be a BackboneAdapter, the name of one ({', '.join(list_adapters())}) or None, "
            f"got {type(adapter).__name__}"
        )
    adapter_cls = adapter_class(adapter)
    try:
        return adapter_cls(backbone, **kwargs)
    except (AttributeError, KeyError) as err:
        fitting = [e.name for e in _REGISTERED + _BUILTIN if e.matcher(backbone)]
        raise ValueError(
            f"adapter={adapter!r} ({adapter_cls.family}) cannot run backbone {_kind(backbone)}: {err}; adapters "
            f"that match it: {', '.join(fitting) or 'none'}"
        ) from err
