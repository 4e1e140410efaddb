"""Backbone adapters, found by model type (see :mod:`sopfast.adapters.base` for the protocol).

Every module of this package is imported here, so a built-in adapter is one file: its class,
decorated with :func:`~sopfast.adapters.registry.builtin_adapter`, registers itself.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import BackboneAdapter
from .registry import find_adapter_class, get_adapter, register_adapter
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
    "find_adapter_class",
    "get_adapter",
    "load_backbone",
    "register_adapter",
]
