"""Hugging Face ``AlbertForSequenceClassification``: layer groups shared across the depth (the last
group runs ``num_hidden_layers / num_hidden_groups`` times), BERT's pooled head."""

from __future__ import annotations

from typing import Any

from torch import nn

from .hf_text import HFTextFamily
from .registry import builtin_adapter, hf_classifier


@builtin_adapter("hf-albert", hf_classifier("AlbertForSequenceClassification"))
class HFAlbertAdapter(HFTextFamily):
    family = "Hugging Face AlbertForSequenceClassification"
    base_model = "albert"
    supports_checkpointing = False  # shared layers: the embedding stops the encoder's forward

    def layers(self, model: Any) -> nn.ModuleList:
        return model.encoder.albert_layer_groups

    def last_layer_calls(self, model: Any) -> int:
        layers, groups = model.config.num_hidden_layers, model.config.num_hidden_groups
        return sum(int(i / (layers / groups)) == groups - 1 for i in range(layers))
