"""Hugging Face ``SwinForImageClassification``, in ``exact`` mode only: the CNN adapter over the grid of
``hidden_states[-2]`` (the input of the last stage: 7×7 at 224 pixels), groups masking pixels.  ``drop``
is refused: the shifted windows of every block need the full grid."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .cnn import CNNAdapter
from .registry import builtin_adapter, hf_classifier


@builtin_adapter("hf-swin", hf_classifier("SwinForImageClassification"))
class HFSwinAdapter(CNNAdapter):
    family = "Hugging Face SwinForImageClassification (exact mode)"
    mode_refusal = "Swin's shifted windows need the full grid of patches; use mode='exact'"
    feature_from_input = True
    #: The classifier's attribute holding the encoder (its ``encoder.layers`` stages).
    base_model = "swin"

    def __init__(self, backbone: nn.Module, **options: Any):
        super().__init__(backbone, **options)
        size = self.backbone.config.image_size
        self.image_size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

    @classmethod
    def defaults(cls, backbone: nn.Module) -> dict[str, Any]:
        model: Any = backbone
        last = len(getattr(model, cls.base_model).encoder.layers) - 1
        return {"feature_layer": f"{cls.base_model}.encoder.layers.{last}", "embed_dim": int(model.config.hidden_size)}

    def to_grid(self, captured: Any) -> torch.Tensor:
        """The last stage's arguments ``(tokens [B, h·w, E], (h, w), …)`` as ``[B, E, h, w]``."""
        tokens, (h, w) = captured[0], captured[1]
        return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], h, w)
