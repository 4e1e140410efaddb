"""Hugging Face ViT-style image classifiers (transformers 4.x and 5.x layouts): ViT, and the families
that differ from it in a few names — DeiT (two prefix tokens), DINOv2 (its head reads [CLS] and the mean
patch state).

:class:`HFViTFamily` is the parameterised base: the classifier's ``base_model`` attribute holds
``embeddings`` (the prefix tokens named by ``prefix_tokens``, ``patch_embeddings`` and a
``position_embeddings`` table over prefix and patches), the blocks (:func:`vit_layers`) and a final
``layernorm``; :meth:`HFViTFamily.head` turns the last blocks' states into logits and
:meth:`HFViTFamily.key` into the group key (the pre-LayerNorm [CLS] state by default).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from ..types import FeatureInputs, GroupPredictions, Groups
from .base import freeze_, trainable_copy
from .flops import TransformerSize, hf_transformer_size
from .hf_common import eager_attention
from .registry import builtin_adapter, hf_classifier
from .vit_common import PatchGridAdapter, run_vit_groups_drop, run_vit_groups_exact, run_vit_groups_exact_pixels

# transformers 4.x names of ViT-style weights → the 5.x layout (order matters: the attention output first).
_LEGACY_NAMES = (
    (re.compile(r"\.encoder\.layer\.(\d+)\."), r".layers.\1."),
    (re.compile(r"\.attention\.attention\.(query|key|value)\."), None),
    (re.compile(r"\.attention\.output\.dense\."), ".attention.o_proj."),
    (re.compile(r"\.intermediate\.dense\."), ".mlp.fc1."),
    (re.compile(r"\.output\.dense\."), ".mlp.fc2."),
)
_QKV = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}


def _layer_out(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def vit_layers(vit: Any) -> nn.ModuleList:
    """The transformer blocks of an HF ``ViTModel`` (read by attribute name): ``vit.layers``
    (transformers 5.x) or ``vit.encoder.layer`` (4.x)."""
    layers = getattr(vit, "layers", None)
    return layers if layers is not None else vit.encoder.layer


def _pair(value: Any) -> tuple[int, int]:
    return (int(value[0]), int(value[1])) if isinstance(value, (tuple, list)) else (int(value), int(value))


class HFViTFamily(PatchGridAdapter):
    """An HF ViT-style classifier: features are the ``(H/p)·(W/p)`` patches (module docstring)."""

    #: The classifier's attribute holding the encoder (embeddings, blocks, final LayerNorm).
    base_model = "vit"
    #: The embeddings' parameters ``[1, 1, E]`` that come before the patches, in order.
    prefix_tokens: tuple[str, ...] = ("cls_token",)

    def __init__(self, backbone: nn.Module):
        super().__init__(backbone)
        self.vit: Any = getattr(self.backbone, self.base_model)
        cfg = self.backbone.config
        self.image_size, self.patch_size = _pair(cfg.image_size), _pair(cfg.patch_size)
        self.grid = (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])
        self.channels = int(cfg.num_channels)
        self.num_prefix_tokens = len(self.prefix_tokens)
        self.projection_source = self.base_model

    @classmethod
    def weight_name(cls, name: str) -> str:
        """transformers 4.x names (``vit.encoder.layer.N.attention.attention.query`` …) in the 5.x layout."""
        for pattern, replacement in _LEGACY_NAMES:
            if replacement is None:
                name = pattern.sub(lambda m: f".attention.{_QKV[m.group(1)]}.", name)
            else:
                name = pattern.sub(replacement, name)
        return name

    @property
    def embed_dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    def transformer_size(self) -> TransformerSize:
        return hf_transformer_size(self.backbone.config)

    def compile_units(self, projection: nn.Module) -> list[nn.Module]:
        return [*vit_layers(self.vit), *vit_layers(projection)]

    def make_projection(self) -> nn.Module:
        projection: Any = trainable_copy(self.vit)
        freeze_(vit_layers(projection)[-1], projection.layernorm, getattr(projection, "pooler", None))
        return projection

    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        h = projection.embeddings(inputs.require_pixels().to(projection.embeddings.cls_token.dtype))
        for layer in vit_layers(projection)[:-1]:
            h = _layer_out(self.run_layer(layer, h, None))
        return h[:, self.num_prefix_tokens :]

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.classifier.weight

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from the last block's states ``h [N, prefix + d, E]``."""
        return self.backbone.classifier(self.vit.layernorm(h)[:, 0])

    def key(self, h: torch.Tensor) -> torch.Tensor:
        """The group key from the last block's states ``h [N, prefix + d, E]``: the pre-LayerNorm [CLS] state."""
        return h[:, 0]

    def _encode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = tokens
        for layer in vit_layers(self.vit):
            h = _layer_out(layer(h, None))
        return self.head(h), self.key(h)

    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        emb = self.vit.embeddings
        pixels = inputs.require_pixels().to(emb.cls_token.dtype)
        patches = emb.patch_embeddings(pixels)
        p = self.num_prefix_tokens
        prefix = torch.cat([getattr(emb, name) for name in self.prefix_tokens], dim=1) + emb.position_embeddings[:, :p]
        positions = emb.position_embeddings[:, p:]

        def with_prefix(tokens: torch.Tensor) -> torch.Tensor:
            return torch.cat([prefix.expand(tokens.shape[0], -1, -1), tokens], dim=1)

        if mode == "exact" and not self.patch_aligned:
            tokens_of = lambda masked: with_prefix(emb.patch_embeddings(masked) + positions)
            return run_vit_groups_exact_pixels(pixels, self.grid, tokens_of, self._encode, groups, chunk_size)
        if mode == "exact":
            blank = emb.patch_embeddings(torch.zeros_like(pixels[:1]))
            add_positions = lambda tokens: with_prefix(tokens + positions)
            return run_vit_groups_exact(patches, blank, add_positions, self._encode, groups, chunk_size)
        return run_vit_groups_drop(with_prefix(patches + positions), p, self._encode, groups, chunk_size)

    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.backbone(pixel_values=inputs.pixels, output_hidden_states=True)
        return out.logits, self.key(out.hidden_states[-1])

    def reference_embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        hidden = projection(pixel_values=inputs.pixels, output_hidden_states=True).hidden_states[-2]
        return hidden[:, self.num_prefix_tokens :]

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return vit_layers(self.vit)[-1], True, self.num_prefix_tokens

    @property
    def has_cls_attention(self) -> bool:
        return True

    def cls_attention(self, inputs: FeatureInputs) -> torch.Tensor:
        with torch.no_grad(), eager_attention(self.backbone):
            out = self.backbone(pixel_values=inputs.pixels, output_attentions=True)
        return out.attentions[-1][:, :, 0, self.num_prefix_tokens :].mean(dim=1).float()


@builtin_adapter("hf-vit", hf_classifier("ViTForImageClassification"))
class HFViTAdapter(HFViTFamily):
    """HF ViT: keys are the pre-LayerNorm CLS state."""

    family = "Hugging Face ViTForImageClassification"


@builtin_adapter("hf-deit", hf_classifier("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"))
class HFDeiTAdapter(HFViTFamily):
    """HF DeiT: [CLS] and the distillation token before the patches; the distilled classifier (``…WithTeacher``)
    averages the heads on both."""

    family = "Hugging Face DeiTForImageClassification (and …WithTeacher)"
    base_model = "deit"
    prefix_tokens = ("cls_token", "distillation_token")

    def classifier_weight(self) -> torch.Tensor:
        head = self.backbone.cls_classifier if hasattr(self.backbone, "cls_classifier") else self.backbone.classifier
        return head.weight

    def head(self, h: torch.Tensor) -> torch.Tensor:
        if not hasattr(self.backbone, "cls_classifier"):
            return super().head(h)
        h = self.vit.layernorm(h)
        return (self.backbone.cls_classifier(h[:, 0]) + self.backbone.distillation_classifier(h[:, 1])) / 2


@builtin_adapter("hf-dinov2", hf_classifier("Dinov2ForImageClassification"))
class HFDinov2Adapter(HFViTFamily):
    """HF DINOv2: the classifier reads [CLS] beside the mean patch state, so the key is both (``[N, 2E]``)."""

    family = "Hugging Face Dinov2ForImageClassification"
    base_model = "dinov2"

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.backbone.classifier(self.key(self.vit.layernorm(h)))

    def key(self, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([h[:, 0], h[:, 1:].mean(dim=1)], dim=-1)
