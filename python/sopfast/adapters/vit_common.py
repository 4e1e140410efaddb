"""Group execution shared by the ViT adapters (HF and timm).

``exact``: every group runs all tokens; a masked patch token is the patch embedding of a
blank patch (the conv bias) plus its position embedding — equal to masking the pixels.
The patch embedding runs once per image, not once per group.  When the image side is not a
multiple of the patch size, the patch mask upsampled to pixels (nearest, as the authors'
code does) no longer follows the patch borders: ``exact`` then masks the pixels and embeds
every group's image (:func:`run_vit_groups_exact_pixels`).
``drop``: only the group's ``k`` patch tokens (after the position embedding) plus the
prefix tokens (CLS / registers) run, gathered with :func:`sopfast.ops.gather_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..checks import check_values
from ..ops import gather_tokens
from ..types import FeatureInputs, GroupPredictions, Groups
from .base import BackboneAdapter, run_chunked
from .images import parameter_dtype, pixel_grid_mask, prepare_pixels

Encoder = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class PatchGridAdapter(BackboneAdapter):
    """Images cut into a fixed patch grid: subclasses set ``image_size``, ``grid`` and ``channels``."""

    modality = "image"
    supported_modes = ("exact", "drop")
    equal_size_modes = ("drop",)
    supports_checkpointing = True
    image_size: tuple[int, int]
    grid: tuple[int, int]
    patch_size: tuple[int, int]
    channels: int

    @property
    def patch_aligned(self) -> bool:
        """Whether the patches tile the image exactly (side = grid · patch)."""
        return all(g * p == s for g, p, s in zip(self.grid, self.patch_size, self.image_size))

    def prepare(self, x, attention_mask=None, token_type_ids=None) -> FeatureInputs:
        return prepare_pixels(x, self.channels, self.image_size, parameter_dtype(self.backbone))

    def num_features(self, inputs: FeatureInputs) -> int:
        return self.grid[0] * self.grid[1]

    def feature_grid(self, inputs: FeatureInputs) -> tuple[int, int]:
        return self.grid


def run_vit_groups_exact(
    patch_tokens: torch.Tensor,
    blank_tokens: torch.Tensor,
    add_positions: Callable[[torch.Tensor], torch.Tensor],
    encode: Encoder,
    groups: Groups,
    chunk_size: int,
) -> GroupPredictions:
    """``patch_tokens [B, d, E]`` and ``blank_tokens [1, d, E]`` (before positions) → predictions."""
    flat_mask = groups.mask.flatten(0, 1).unsqueeze(-1)
    return run_chunked(
        groups,
        chunk_size,
        lambda rows, example: encode(add_positions(torch.where(flat_mask[rows], patch_tokens[example], blank_tokens))),
    )


def run_vit_groups_exact_pixels(
    pixels: torch.Tensor,
    grid: tuple[int, int],
    tokens_of: Callable[[torch.Tensor], torch.Tensor],
    encode: Encoder,
    groups: Groups,
    chunk_size: int,
) -> GroupPredictions:
    """``pixels [B, C, H, W]`` masked by each group's patch mask upsampled to pixels (nearest),
    then ``tokens_of`` (patch embedding + positions) and ``encode``, chunk by chunk."""
    flat_mask = groups.mask.flatten(0, 1)
    size = (pixels.shape[-2], pixels.shape[-1])

    def run(rows: slice, example: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        masked = pixels[example] * pixel_grid_mask(flat_mask[rows], grid, size).to(pixels.dtype)
        return encode(tokens_of(masked))

    return run_chunked(groups, chunk_size, run)


def run_vit_groups_drop(
    positioned: torch.Tensor, prefix: int, encode: Encoder, groups: Groups, chunk_size: int
) -> GroupPredictions:
    """``positioned [B, prefix + d, E]`` (positions added) → predictions on gathered tokens."""
    check_values(
        (groups.indices >= 0).all(),
        "ViT drop mode needs groups of equal size (index -1 padding would run as zero tokens); "
        "use mode='exact' for groups of different sizes",
    )
    gathered = gather_tokens(positioned, groups.indices + prefix, prefix=prefix)
    return run_chunked(groups, chunk_size, lambda rows, _example: encode(gathered[rows]))
