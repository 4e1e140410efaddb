"""How the frozen backbone runs, apart from what it computes: the dtype its weights are held in
(``SOP(backbone_dtype=...)``)."""

from __future__ import annotations

from torch import nn

from ..checks import BACKBONE_DTYPES
from .checkpoint import hash_backbone


def cast_backbone(backbone: nn.Module, dtype: str | None) -> str | None:
    """Cast ``backbone``'s floating weights and buffers to ``dtype`` (a name of
    :data:`~sopfast.checks.BACKBONE_DTYPES`; ``None``: leave it), in place; the SHA-256 of the backbone as
    given when the cast changed it (what a saved model records), else ``None``."""
    if dtype is None:
        return None
    target = BACKBONE_DTYPES[dtype]
    tensors = [*backbone.parameters(), *backbone.buffers()]
    if all(t.dtype == target for t in tensors if t.is_floating_point()):
        return None
    given = hash_backbone(backbone)
    backbone.to(target)
    return given
