"""Everything that knows a backbone family — what this room owns: the adapter protocol
(:class:`BackboneAdapter`, :mod:`sopfast.adapters.base`), one module per family, the public family bases a
new family is a few lines on (:class:`HFViTFamily`, :class:`HFTextFamily`, :class:`CNNAdapter` and the
Hugging Face CNN, Swin and BEiT bases, with :func:`hf_classifier` to match them), the registry that gives a
backbone its adapter (:mod:`sopfast.adapters.registry`), the conformance check an adapter proves itself with
(:func:`check`, :mod:`sopfast.adapters.conformance`), where backbones load from and how their inputs are
preprocessed.

Every module of this package is imported here, so a built-in adapter is one file: its class,
decorated with :func:`~sopfast.adapters.registry.builtin_adapter`, registers itself.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import BackboneAdapter
from .conformance import AdapterCheck, AdapterCheckError
from .registry import (
    adapter_class,
    check,
    find_adapter_class,
    get_adapter,
    hf_classifier,
    list_adapters,
    register_adapter,
)
from .sources import Backbone, BackboneSourceError, load_backbone

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

from .cnn import CNNAdapter  # noqa: E402 - after the registration loop, which imports them anyway
from .hf_beit import HFBeitAdapter  # noqa: E402
from .hf_bert import HFBertAdapter  # noqa: E402
from .hf_cnn import HFStagesAdapter  # noqa: E402
from .hf_swin import HFSwinAdapter  # noqa: E402
from .hf_text import HFTextFamily  # noqa: E402
from .hf_vit import HFViTAdapter, HFViTFamily  # noqa: E402
from .timm_vit import TimmViTAdapter  # noqa: E402

__all__ = [
    "AdapterCheck",
    "AdapterCheckError",
    "Backbone",
    "BackboneAdapter",
    "BackboneSourceError",
    "CNNAdapter",
    "HFBeitAdapter",
    "HFBertAdapter",
    "HFStagesAdapter",
    "HFSwinAdapter",
    "HFTextFamily",
    "HFViTAdapter",
    "HFViTFamily",
    "TimmViTAdapter",
    "adapter_class",
    "check",
    "find_adapter_class",
    "get_adapter",
    "hf_classifier",
    "list_adapters",
    "load_backbone",
    "register_adapter",
]
