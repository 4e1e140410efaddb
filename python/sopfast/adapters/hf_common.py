"""Helpers shared by the Hugging Face adapters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def eager_attention(backbone: Any) -> Iterator[None]:
    """Temporarily switch an HF model to eager attention (the only one that returns weights).

    ``backbone`` is a Hugging Face model, read by attribute name (``config``, ``set_attn_implementation``)."""
    old = getattr(backbone.config, "_attn_implementation", "eager")
    if old == "eager" or not hasattr(backbone, "set_attn_implementation"):
        yield
        return
    backbone.set_attn_implementation("eager")
    try:
        yield
    finally:
        backbone.set_attn_implementation(old)
