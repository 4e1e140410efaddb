"""Launch helpers shared by the Triton wrappers."""

from __future__ import annotations

import contextlib

import torch


def on_device(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Make ``tensor``'s GPU the current device for a launch: Triton launches on the current device,
    so without it a tensor on another GPU is read by a kernel running on the wrong one.  A no-op for
    CPU tensors (Triton's interpreter)."""
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()
