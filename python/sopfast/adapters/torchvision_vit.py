"""Adapter for torchvision ``VisionTransformer`` (``vit_b_16``, ``vit_l_32`` …, class token).

The position table covers the class token too; the group key is the class token's state after
the last block, before the encoder's final LayerNorm; the classifier is ``heads.head``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..types import FeatureInputs, GroupPredictions, Groups
from .base import freeze_
from .flops import TransformerSize
from .registry import builtin_adapter, class_names
from .vit_common import PatchGridAdapter, run_vit_groups_drop, run_vit_groups_exact, run_vit_groups_exact_pixels


def _is_torchvision_vit(model: nn.Module) -> bool:
    return "VisionTransformer" in class_names(model) and type(model).__module__.startswith("torchvision")


@builtin_adapter("torchvision-vit", _is_torchvision_vit)
class TorchvisionViTAdapter(PatchGridAdapter):
    """torchvision ViT: patches are the features; keys are the class token's pre-LayerNorm state."""

    family = "torchvision VisionTransformer (vit_b_16, ...)"
    num_prefix_tokens = 1

    def __init__(self, backbone: nn.Module):
        super().__init__(backbone)
        vit: Any = backbone
        if not isinstance(vit.heads, nn.Sequential) or list(dict(vit.heads.named_children())) != ["head"]:
            raise ValueError(
                "torchvision ViT with representation_size (a pre-logits layer) is not supported: the group keys "
                "must be the classifier's input"
            )
        self.image_size = (int(vit.image_size), int(vit.image_size))
        self.patch_size = (int(vit.patch_size), int(vit.patch_size))
        self.grid = (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])
        self.channels = int(vit.conv_proj.in_channels)

    @classmethod
    def constructor_options(cls, probe: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The image size the weights' position table (class token + patches) was made for."""
        table = state.get("encoder.pos_embedding")
        if table is None:
            return {}
        side = round((int(table.shape[1]) - 1) ** 0.5)
        vit: Any = probe
        return {"image_size": side * int(vit.patch_size)} if side * side == int(table.shape[1]) - 1 else {}

    @classmethod
    def open_constructor_options(cls, probe: nn.Module) -> dict[str, Any]:
        """The heads (and, since torchvision's builders fix depth and width by name, nothing else)."""
        vit: Any = probe
        return {"num_heads": int(vit.encoder.layers[0].self_attention.num_heads)}

    @property
    def embed_dim(self) -> int:
        return int(self.backbone.hidden_dim)

    def transformer_size(self) -> TransformerSize:
        return TransformerSize(self.embed_dim, len(self.backbone.encoder.layers), int(self.backbone.mlp_dim))

    def compile_units(self, projection: Any) -> list[nn.Module]:
        return [*self.backbone.encoder.layers, *projection.encoder.layers]

    def make_projection(self) -> nn.Module:
        projection: Any = super().make_projection()
        freeze_(projection.encoder.layers[-1], projection.encoder.ln, projection.heads)
        return projection

    @staticmethod
    def _patches(model: Any, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, d, E]`` patch embeddings (before positions)."""
        return model.conv_proj(pixels).flatten(2).transpose(1, 2)

    @staticmethod
    def _positioned(model: Any, patches: torch.Tensor) -> torch.Tensor:
        """Class token and ``patches [N, d, E]`` with the position table added: ``[N, 1 + d, E]``."""
        cls = model.class_token.expand(patches.shape[0], -1, -1)
        return torch.cat([cls, patches], dim=1) + model.encoder.pos_embedding

    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        pixels = inputs.require_pixels().to(projection.conv_proj.weight.dtype)
        h = projection.encoder.dropout(self._positioned(projection, self._patches(projection, pixels)))
        for layer in projection.encoder.layers[:-1]:
            h = self.run_layer(layer, h)
        return h[:, 1:]

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.heads.head.weight

    def _encode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        encoder = self.backbone.encoder
        h = encoder.layers(encoder.dropout(tokens))
        return self.backbone.heads(encoder.ln(h)[:, 0]), h[:, 0]

    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        model = self.backbone
        pixels = inputs.require_pixels().to(model.conv_proj.weight.dtype)
        positioned = lambda patches: self._positioned(model, patches)
        if mode == "exact" and not self.patch_aligned:
            tokens_of = lambda masked: positioned(self._patches(model, masked))
            return run_vit_groups_exact_pixels(pixels, self.grid, tokens_of, self._encode, groups, chunk_size)
        patches = self._patches(model, pixels)
        if mode == "exact":
            blank = self._patches(model, torch.zeros_like(pixels[:1]))
            return run_vit_groups_exact(patches, blank, positioned, self._encode, groups, chunk_size)
        return run_vit_groups_drop(positioned(patches), 1, self._encode, groups, chunk_size)

    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.backbone
        pixels = inputs.require_pixels().to(model.conv_proj.weight.dtype)
        return self._encode(self._positioned(model, self._patches(model, pixels)))

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return self.backbone.encoder.layers[-1], True, 1
