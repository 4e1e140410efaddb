"""Group execution shared by the ViT adapters (HF and timm).

``exact``: every group runs all tokens; a masked patch token is the patch embedding of a
blank patch (the conv bias) plus its position embedding — equal to masking the pixels.
The patch embedding runs once per image, not once per group.
``drop``: only the group's ``k`` patch tokens (after the position embedding) plus the
prefix tokens (CLS / registers) run, gathered with :func:`sopfast.ops.gather_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..ops import gather_tokens
from ..types import FeatureInputs, GroupPredictions, Groups
from .base import BackboneAdapter, chunks, group_batch_index
from .images import prepare_pixels

Encoder = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class PatchGridAdapter(BackboneAdapter):
    """Images cut into a fixed patch grid: subclasses set ``image_size``, ``grid`` and ``channels``."""

    modality = "image"
    supported_modes = ("exact", "drop")
    image_size: tuple[int, int]
    grid: tuple[int, int]
    channels: int

    def prepare(self, x, attention_mask=None, token_type_ids=None) -> FeatureInputs:
        return prepare_pixels(x, self.channels, self.image_size)

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
    b, m, _ = groups.mask.shape
    flat_mask = groups.mask.reshape(b * m, -1, 1)
    example = group_batch_index(groups)
    logits, keys = [], []
    for sl in chunks(b * m, chunk_size):
        tokens = torch.where(flat_mask[sl], patch_tokens[example[sl]], blank_tokens)
        y, z = encode(add_positions(tokens))
        logits.append(y)
        keys.append(z)
    return _stack(logits, keys, b, m)


def run_vit_groups_drop(
    positioned: torch.Tensor, prefix: int, encode: Encoder, groups: Groups, chunk_size: int
) -> GroupPredictions:
    """``positioned [B, prefix + d, E]`` (positions added) → predictions on gathered tokens."""
    b, m, _ = groups.mask.shape
    if bool((groups.indices < 0).any()):
        raise ValueError(
            "ViT drop mode needs groups of equal size (index -1 padding would run as zero tokens); "
            "use mode='exact' for groups of different sizes"
        )
    indices = groups.indices + prefix
    gathered = gather_tokens(positioned, indices, prefix=prefix)
    logits, keys = [], []
    for sl in chunks(b * m, chunk_size):
        y, z = encode(gathered[sl])
        logits.append(y)
        keys.append(z)
    return _stack(logits, keys, b, m)


def _stack(logits: list[torch.Tensor], keys: list[torch.Tensor], b: int, m: int) -> GroupPredictions:
    y = torch.cat(logits).reshape(b, m, -1)
    z = torch.cat(keys).reshape(b, m, -1)
    return GroupPredictions(logits=y, keys=z)
