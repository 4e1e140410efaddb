"""How the frozen backbone and the projection run, apart from what they compute: the dtype the backbone's
weights are held in (``SOP(backbone_dtype=...)``) and ``torch.compile`` of their blocks (``SOP(compile=...)``)."""

from __future__ import annotations

from typing import Any

import torch
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


#: What ``SOP(compile=...)`` takes: off, on, or on where the inputs are on a CUDA device.
COMPILE_CHOICES: tuple[bool | str, ...] = (False, True, "auto")
#: ``nn.Module.compile`` options of every compiled block: static shapes (a new chunk width compiles anew).
COMPILE_OPTIONS: dict[str, Any] = {"dynamic": False}


def compiles_on(option: bool | str, device: torch.device) -> bool:
    """Whether ``SOP(compile=option)`` compiles for inputs on ``device``: ``True`` everywhere, ``"auto"`` on a
    CUDA device only (unmeasured there until ``bench/gpu_script.py``'s compile step runs on a card; on the
    CPU compiled blocks measured no faster, ``bench/RESULTS_compile_cpu.md``)."""
    return option is True or (option == "auto" and device.type == "cuda")


def compile_blocks(blocks: list[nn.Module]) -> None:
    """``torch.compile`` each of ``blocks`` in place (``nn.Module.compile``: its ``state_dict`` and hash are
    unchanged, and so are its results, up to the compiler's floating-point reordering)."""
    for block in blocks:
        block.compile(**COMPILE_OPTIONS)
