"""One device resolver for every part of sopfast (Python API and command line): what a device name means
(:func:`check_device`, :func:`resolve_device`), where a module lives (:func:`module_device`), and the
optimizer that suits it (:func:`adamw`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

ALLOWED = "cpu, cuda, cuda:N, mps"


def check_device(device: str | torch.device) -> torch.device:
    """``device`` parsed, without looking at this machine: a ValueError naming ``device`` and what is
    allowed for anything but a CPU, CUDA or MPS device name."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a device; allowed: {ALLOWED}") from err
    if parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {str(device)!r} is not supported; allowed: {ALLOWED}")
    return parsed


def resolve_device(device: str | torch.device | None = None, *, local_rank: int | None = None) -> torch.device:
    """``device`` as a ``torch.device`` that exists on this machine.

    ``None`` picks CUDA when available, else the CPU; CUDA without an index is this process's GPU
    (``local_rank`` under torchrun, else the current one).  A device that is not a device, or that
    this machine lacks, is a ValueError naming it and what is allowed.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = check_device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r}: CUDA is not available on this machine; use 'cpu'")
        if resolved.index is None:
            index = local_rank if local_rank is not None else torch.cuda.current_device()
            return torch.device("cuda", index)
        if resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {str(device)!r}: MPS is not available on this machine; use 'cpu'")
    return resolved


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter; the CPU for a module without parameters."""
    return next((p.device for p in module.parameters()), torch.device("cpu"))


#: The floating dtypes ``torch.optim.AdamW(fused=True)`` takes on a CUDA device.
FUSED_ADAMW_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fused_adamw(params: Iterable[torch.Tensor]) -> bool:
    """Whether AdamW over ``params`` runs fused (``torch.optim.AdamW(fused=True)``: one kernel per step
    instead of a few per tensor): every parameter a floating tensor on a CUDA device.  False for none, and
    on the CPU or MPS (unmeasured there: the ordinary ``foreach`` AdamW)."""
    tensors = list(params)
    return bool(tensors) and all(p.device.type == "cuda" and p.dtype in FUSED_ADAMW_DTYPES for p in tensors)


def adamw(params: Iterable[torch.Tensor], **options: Any) -> torch.optim.AdamW:
    """``torch.optim.AdamW(params, **options)``, fused where :func:`fused_adamw` says so."""
    tensors = list(params)
    return torch.optim.AdamW(tensors, fused=fused_adamw(tensors) or None, **options)
