"""Adapter for Hugging Face ``ViTForImageClassification`` (transformers 4.x and 5.x layouts)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..types import FeatureInputs, GroupPredictions, Groups
from .base import freeze_, trainable_copy
from .hf_common import eager_attention
from .registry import builtin_adapter, class_names
from .vit_common import PatchGridAdapter, run_vit_groups_drop, run_vit_groups_exact, run_vit_groups_exact_pixels


def _layer_out(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def vit_layers(vit: Any) -> nn.ModuleList:
    """The transformer blocks of an HF ``ViTModel`` (read by attribute name): ``vit.layers``
    (transformers 5.x) or ``vit.encoder.layer`` (4.x)."""
    layers = getattr(vit, "layers", None)
    return layers if layers is not None else vit.encoder.layer


@builtin_adapter(lambda model: "ViTForImageClassification" in class_names(model))
class HFViTAdapter(PatchGridAdapter):
    """HF ViT: features are the ``(H/p)·(W/p)`` patches; keys are the pre-LayerNorm CLS state."""

    family = "Hugging Face ViTForImageClassification"

    projection_source = "vit"

    def __init__(self, backbone: nn.Module):
        super().__init__(backbone)
        self.vit: Any = self.backbone.vit
        cfg = self.backbone.config
        size = cfg.image_size if isinstance(cfg.image_size, (tuple, list)) else (cfg.image_size, cfg.image_size)
        patch = cfg.patch_size if isinstance(cfg.patch_size, (tuple, list)) else (cfg.patch_size, cfg.patch_size)
        self.image_size = (int(size[0]), int(size[1]))
        self.patch_size = (int(patch[0]), int(patch[1]))
        self.grid = (self.image_size[0] // patch[0], self.image_size[1] // patch[1])
        self.channels = int(cfg.num_channels)

    @property
    def embed_dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    def make_projection(self) -> nn.Module:
        projection: Any = trainable_copy(self.vit)
        freeze_(vit_layers(projection)[-1], projection.layernorm, getattr(projection, "pooler", None))
        return projection

    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        h = projection.embeddings(inputs.require_pixels().to(projection.embeddings.cls_token.dtype))
        for layer in vit_layers(projection)[:-1]:
            h = _layer_out(self.run_layer(layer, h, None))
        return h[:, 1:]

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.classifier.weight

    def _encode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = tokens
        for layer in vit_layers(self.vit):
            h = _layer_out(layer(h, None))
        cls = h[:, 0]
        return self.backbone.classifier(self.vit.layernorm(cls)), cls

    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        emb = self.vit.embeddings
        pixels = inputs.require_pixels().to(emb.cls_token.dtype)
        patches = emb.patch_embeddings(pixels)
        cls = emb.cls_token + emb.position_embeddings[:, :1]
        positions = emb.position_embeddings[:, 1:]
        if mode == "exact" and not self.patch_aligned:

            def tokens_of(masked: torch.Tensor) -> torch.Tensor:
                tokens = emb.patch_embeddings(masked) + positions
                return torch.cat([cls.expand(tokens.shape[0], -1, -1), tokens], dim=1)

            return run_vit_groups_exact_pixels(pixels, self.grid, tokens_of, self._encode, groups, chunk_size)
        if mode == "exact":
            blank = emb.patch_embeddings(torch.zeros_like(pixels[:1]))

            def add_positions(tokens: torch.Tensor) -> torch.Tensor:
                return torch.cat([cls.expand(tokens.shape[0], -1, -1), tokens + positions], dim=1)

            return run_vit_groups_exact(patches, blank, add_positions, self._encode, groups, chunk_size)
        positioned = torch.cat([cls.expand(patches.shape[0], -1, -1), patches + positions], dim=1)
        return run_vit_groups_drop(positioned, 1, self._encode, groups, chunk_size)

    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.backbone(pixel_values=inputs.pixels, output_hidden_states=True)
        return out.logits, out.hidden_states[-1][:, 0]

    def reference_embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        return projection(pixel_values=inputs.pixels, output_hidden_states=True).hidden_states[-2][:, 1:]

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return vit_layers(self.vit)[-1], True, 1

    @property
    def has_cls_attention(self) -> bool:
        return True

    def cls_attention(self, inputs: FeatureInputs) -> torch.Tensor:
        with torch.no_grad(), eager_attention(self.backbone):
            out = self.backbone(pixel_values=inputs.pixels, output_attentions=True)
        return out.attentions[-1][:, :, 0, 1:].mean(dim=1).float()
