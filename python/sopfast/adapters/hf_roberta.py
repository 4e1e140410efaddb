"""Hugging Face RoBERTa and XLM-RoBERTa sequence classifiers: positions count from ``pad_token_id + 1``
and the head (dense, tanh, ``out_proj``) reads the first token's state."""

from __future__ import annotations

from typing import Any

import torch

from .hf_text import HFTextFamily
from .registry import builtin_adapter, hf_classifier


@builtin_adapter("hf-roberta", hf_classifier("RobertaForSequenceClassification"))
class HFRobertaAdapter(HFTextFamily):
    family = "Hugging Face RobertaForSequenceClassification"
    base_model = "roberta"

    def position_offset(self) -> int:
        return self.pad + 1

    def head(self, out: Any) -> torch.Tensor:
        return self.backbone.classifier(out.last_hidden_state)

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.classifier.out_proj.weight


@builtin_adapter("hf-xlm-roberta", hf_classifier("XLMRobertaForSequenceClassification"))
class HFXLMRobertaAdapter(HFRobertaAdapter):
    family = "Hugging Face XLMRobertaForSequenceClassification"
