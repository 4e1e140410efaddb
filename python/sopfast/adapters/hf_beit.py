"""Hugging Face ``BeitForImageClassification``, in ``exact`` mode only: the CNN adapter over the patch grid
of ``hidden_states[-2]`` (the input of the last block), groups masking pixels; keys are the classifier's
input (the pooled patch states).  ``drop`` is refused: BEiT's relative position bias is laid out on the
full grid of patches.  A BEiT-like family (Data2Vec-Vision) is this class with another ``base_model``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .cnn import CNNAdapter, module_name
from .hf_vit import vit_layers
from .registry import builtin_adapter, hf_classifier


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


@builtin_adapter("hf-beit", hf_classifier("BeitForImageClassification"))
class HFBeitAdapter(CNNAdapter):
    family = "Hugging Face BeitForImageClassification (exact mode)"
    mode_refusal = "BEiT's relative position bias is laid out on the full grid of patches; use mode='exact'"
    feature_from_input = True
    num_prefix_tokens = 1
    #: The classifier's attribute holding the encoder (its ``encoder.layer`` / ``layers`` blocks).
    base_model = "beit"

    def __init__(self, backbone: nn.Module, **options: Any):
        super().__init__(backbone, **options)
        cfg = self.backbone.config
        self.image_size = _pair(cfg.image_size)
        patch = _pair(cfg.patch_size)
        self.grid = (self.image_size[0] // patch[0], self.image_size[1] // patch[1])

    @classmethod
    def defaults(cls, backbone: nn.Module) -> dict[str, Any]:
        model: Any = backbone
        last = module_name(backbone, vit_layers(getattr(model, cls.base_model))[-1])
        return {"feature_layer": last, "embed_dim": int(model.config.hidden_size)}

    def to_grid(self, captured: Any) -> torch.Tensor:
        """The last block's input ``[B, 1 + h·w, E]`` (CLS first) as ``[B, E, h, w]``."""
        patches = captured[0][:, self.num_prefix_tokens :]
        return patches.transpose(1, 2).reshape(patches.shape[0], patches.shape[2], *self.grid)
