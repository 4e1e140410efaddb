"""Hugging Face ``DistilBertForSequenceClassification``: no token types, layers under ``transformer``,
a ``pre_classifier`` with ReLU before the classifier."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .hf_text import HFTextFamily
from .registry import builtin_adapter, hf_classifier


@builtin_adapter("hf-distilbert", hf_classifier("DistilBertForSequenceClassification"))
class HFDistilBertAdapter(HFTextFamily):
    family = "Hugging Face DistilBertForSequenceClassification"
    base_model = "distilbert"
    token_types = False
    supports_checkpointing = False  # its layers take another mask on transformers 4.x: the embedding stops the forward

    def layers(self, model: Any) -> nn.ModuleList:
        return model.transformer.layer

    def head(self, out: Any) -> torch.Tensor:
        b = self.backbone
        return b.classifier(b.dropout(torch.relu(b.pre_classifier(out.last_hidden_state[:, 0]))))
