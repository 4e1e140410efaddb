"""Backbone adapters, found by model type or chosen by name (see :mod:`sopfast.adapters.base` for the
protocol, :mod:`sopfast.adapters.registry` for the choice).

Every module of this package is imported here, so a built-in adapter is one file: its class,
decorated with :func:`~sopfast.adapters.registry.builtin_adapter`, registers itself.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import BackboneAdapter
from .registry import adapter_class, find_adapter_class, get_adapter, list_adapters, register_adapter
from .sources import Backbone, BackboneSourceError, load_backbone

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

from .cnn import CNNAdapter  # noqa: E402 - after the registration loop, which imports them anyway
from .hf_bert import HFBertAdapter  # noqa: E402
from .hf_vit import HFViTAdapter  # noqa: E402
from .timm_vit import TimmViTAdapter  # noqa: E402

__all__ = [
    "Backbone",
    "BackboneAdapter",
    "BackboneSourceError",
    "CNNAdapter",
    "HFBertAdapter",
    "HFViTAdapter",
    "TimmViTAdapter",
    "adapter_class",
    "find_adapter_class",
    "get_adapter",
    "list_adapters",
    "load_backbone",
    "register_adapter",
]
