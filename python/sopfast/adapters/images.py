"""Shared input handling for image backbones."""

from __future__ import annotations

import torch

from ..checks import check_values
from ..types import FeatureInputs


def check_finite(name: str, t: torch.Tensor) -> None:
    """ValueError if ``t`` holds NaN or ±Inf (a min/max reduction: no tensor of ``t``'s size is made; on a
    GPU a device-side assertion, :func:`sopfast.checks.check_values`)."""
    if t.is_floating_point() and t.numel():
        finite = torch.isfinite(torch.stack(torch.aminmax(t))).all()
        check_values(finite, f"{name} contains NaN or Inf values; SOP needs finite inputs")


def prepare_pixels(
    x: torch.Tensor, channels: int | None, size: tuple[int, int] | None, dtype: torch.dtype | None = None
) -> FeatureInputs:
    """Validate an image batch ``[B, C, H, W]`` (floating, finite, expected channels / size) and cast
    it to the backbone's ``dtype`` (fp16 or fp64 images for an fp32 backbone)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor [B, C, H, W], got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"images must have shape [B, C, H, W], got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"images must be a floating tensor (normalised pixels), got {x.dtype}")
    if channels is not None and x.shape[1] != channels:
        raise ValueError(f"images must have {channels} channels, got {x.shape[1]} (shape {tuple(x.shape)})")
    if size is not None and tuple(x.shape[-2:]) != tuple(size):
        raise ValueError(f"images must be {size[0]}x{size[1]} pixels for this backbone, got {tuple(x.shape[-2:])}")
    check_finite("images", x)
    return FeatureInputs(pixels=x if dtype is None else x.to(dtype))


def parameter_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of ``module``'s first floating parameter (``None`` without one)."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


def upsample_mask(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest upsampling of bool ``mask [N, h, w]`` to ``[N, H, W]`` (F.interpolate's 'nearest' rule)."""
    h, w = mask.shape[-2:]
    rows = _nearest_source(size[0], h, mask.device)
    cols = _nearest_source(size[1], w, mask.device)
    return mask.index_select(-2, rows).index_select(-1, cols)


def _nearest_source(out_size: int, in_size: int, device: torch.device) -> torch.Tensor:
    scale = in_size / out_size
    src = (torch.arange(out_size, device=device, dtype=torch.float32) * scale).floor().long()
    return src.clamp_max(in_size - 1)


def pixel_grid_mask(mask: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """``mask [N, d]`` on the feature grid → ``[N, 1, H, W]`` bool pixel mask."""
    return upsample_mask(mask.view(-1, *grid), size).unsqueeze(1)
