"""Hugging Face ``ElectraForSequenceClassification``: embeddings projected to the hidden size
(``embeddings_project``) and RoBERTa's head on the first token's state."""

from __future__ import annotations

from typing import Any

import torch

from .hf_text import HFTextFamily
from .registry import builtin_adapter, hf_classifier


@builtin_adapter("hf-electra", hf_classifier("ElectraForSequenceClassification"))
class HFElectraAdapter(HFTextFamily):
    family = "Hugging Face ElectraForSequenceClassification"
    base_model = "electra"

    def embedding_output(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        h = super().embedding_output(model, input_ids, token_type_ids)
        project = getattr(model, "embeddings_project", None)
        return h if project is None else project(h)

    def head(self, out: Any) -> torch.Tensor:
        return self.backbone.classifier(out.last_hidden_state)

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.classifier.out_proj.weight
