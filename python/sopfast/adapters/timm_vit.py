"""Adapter for timm ``VisionTransformer`` (class-token or average pooling)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..types import FeatureInputs, GroupPredictions, Groups
from .base import AdapterHookMissing, freeze_
from .flops import TransformerSize
from .registry import builtin_adapter, class_names
from .vit_common import PatchGridAdapter, run_vit_groups_drop, run_vit_groups_exact, run_vit_groups_exact_pixels


def _pair(values: Any) -> tuple[int, int]:
    """timm's 2-tuples (``img_size``, ``grid_size``, ``patch_size``) as a pair of ints."""
    first, second = values
    return int(first), int(second)


def _is_timm_vit(model: nn.Module) -> bool:
    return "VisionTransformer" in class_names(model) and type(model).__module__.startswith("timm")


@builtin_adapter("timm-vit", _is_timm_vit)
class TimmViTAdapter(PatchGridAdapter):
    """timm ViT: patches are the features; keys are the pre-norm CLS state (mean patch state
    for average-pooled models without a class token)."""

    family = "timm VisionTransformer"

    def __init__(self, backbone: nn.Module):
        super().__init__(backbone)
        if backbone.global_pool not in ("token", "avg"):
            raise ValueError(f"timm ViT global_pool={backbone.global_pool!r} is not supported; use 'token' or 'avg'")
        if getattr(backbone, "dynamic_img_size", False):
            raise ValueError("timm ViT with dynamic_img_size=True is not supported; build it with a fixed img_size")
        pe = self.backbone.patch_embed
        self.image_size = _pair(pe.img_size)
        self.grid = _pair(pe.grid_size)
        self.patch_size = _pair(pe.patch_size)
        self.channels = int(pe.proj.in_channels)
        self.prefix = self.num_prefix_tokens = int(self.backbone.num_prefix_tokens)

    @classmethod
    def constructor_options(cls, probe: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """What the weights fix: width, channels and patch size (the patch embedding), depth (the blocks),
        the MLP ratio, the qkv bias, layer scale, the class / register tokens, the pre-norm and pooling
        norms, and the image size the position table was made for (a fixed one: no ``dynamic_img_size``)."""
        options: dict[str, Any] = {"dynamic_img_size": False}
        proj = state.get("patch_embed.proj.weight")
        blocks = {int(k.split(".")[1]) for k in state if k.startswith("blocks.") and k.split(".")[1].isdigit()}
        if proj is None or proj.dim() != 4 or not blocks:
            return options
        width, channels, height, across = (int(n) for n in proj.shape)
        options.update(embed_dim=width, in_chans=channels, depth=max(blocks) + 1)
        options["patch_size"] = height if height == across else (height, across)
        if "blocks.0.mlp.fc1.weight" in state:
            options["mlp_ratio"] = int(state["blocks.0.mlp.fc1.weight"].shape[0]) / width
        if "blocks.0.attn.qkv.weight" in state:
            options["qkv_bias"] = "blocks.0.attn.qkv.bias" in state
        if "blocks.0.ls1.gamma" in state:
            options["init_values"] = 1e-5  # layer scale on (its values are the weights')
        options["class_token"] = "cls_token" in state
        options["reg_tokens"] = int(state["reg_token"].shape[1]) if "reg_token" in state else 0
        options["pre_norm"] = "norm_pre.weight" in state
        if "fc_norm.weight" in state or "norm.weight" in state:
            options["fc_norm"] = "fc_norm.weight" in state
        vit: Any = probe
        if not options["class_token"] and vit.global_pool == "token":
            options["global_pool"] = "avg"  # a model without a class token pools its patches
        if "pos_embed" in state:
            prefix = 0 if vit.no_embed_class else int(options["class_token"]) + options["reg_tokens"]
            tokens = int(state["pos_embed"].shape[1]) - prefix
            side = round(tokens**0.5)
            if side * side == tokens and height == across:
                options["img_size"] = side * height
        return options

    @classmethod
    def open_constructor_options(cls, probe: nn.Module) -> dict[str, Any]:
        """The heads: a ``[3E, E]`` qkv weight splits into any number of heads that divides ``E``."""
        vit: Any = probe
        return {"num_heads": int(vit.blocks[0].attn.num_heads)}

    @property
    def embed_dim(self) -> int:
        return int(self.backbone.embed_dim)

    def transformer_size(self) -> TransformerSize:
        blocks = self.backbone.blocks
        return TransformerSize(self.embed_dim, len(blocks), int(blocks[0].mlp.fc1.out_features))

    def compile_units(self, projection: Any) -> list[nn.Module]:
        return [*self.backbone.blocks, *projection.blocks]

    def make_projection(self) -> nn.Module:
        projection: Any = super().make_projection()
        freeze_(
            projection.blocks[-1],
            projection.norm,
            projection.fc_norm,
            projection.head,
            getattr(projection, "attn_pool", None),
        )
        return projection

    @staticmethod
    def _tokens(model: Any, pixels: torch.Tensor) -> torch.Tensor:
        x = model._pos_embed(model.patch_embed(pixels))
        return model.norm_pre(model.patch_drop(x))

    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        x = self._tokens(projection, inputs.require_pixels())
        for block in projection.blocks[:-1]:
            x = self.run_layer(block, x)
        return x[:, self.prefix :]

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.head.weight

    def _key(self, x: torch.Tensor) -> torch.Tensor:
        if self.backbone.global_pool == "token":
            return x[:, 0]
        return x[:, self.prefix :].mean(dim=1)

    def _encode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.backbone
        x = model.blocks(model.norm_pre(model.patch_drop(tokens)))
        return model.forward_head(model.norm(x)), self._key(x)

    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        model = self.backbone
        pixels = inputs.require_pixels()
        if mode == "exact" and not self.patch_aligned:
            tokens_of = lambda masked: model._pos_embed(model.patch_embed(masked))
            return run_vit_groups_exact_pixels(pixels, self.grid, tokens_of, self._encode, groups, chunk_size)
        patches = model.patch_embed(pixels)
        if mode == "exact":
            blank = model.patch_embed(torch.zeros_like(pixels[:1]))
            return run_vit_groups_exact(patches, blank, model._pos_embed, self._encode, groups, chunk_size)
        return run_vit_groups_drop(model._pos_embed(patches), self.prefix, self._encode, groups, chunk_size)

    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.backbone
        x = model.blocks(self._tokens(model, inputs.require_pixels()))
        return model.forward_head(model.norm(x)), self._key(x)

    def reference_embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        hidden_states = [self._tokens(projection, inputs.require_pixels())]
        for block in projection.blocks:
            hidden_states.append(block(hidden_states[-1]))
        return hidden_states[-2][:, self.prefix :]

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return self.backbone.blocks[-1], True, self.prefix

    @property
    def has_cls_attention(self) -> bool:
        return self.backbone.global_pool == "token"

    def cls_attention(self, inputs: FeatureInputs) -> torch.Tensor:
        if not self.has_cls_attention:
            raise AdapterHookMissing(self, "cls_attention", "FRESH with source='cls' (a timm ViT with a class token)")
        attn = self.backbone.blocks[-1].attn
        captured: list[torch.Tensor] = []
        handle = attn.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))
        try:
            with torch.no_grad():
                self.full_forward(inputs)
        finally:
            handle.remove()
        x = captured[-1]
        b, n, _ = x.shape
        qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
        weights = ((q[:, :, :1] * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return weights[:, :, 0, self.prefix :].mean(dim=1).float()
