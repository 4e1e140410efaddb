"""Hugging Face ``DebertaV2ForSequenceClassification`` (DeBERTa-v2 and v3), in ``exact`` mode only: its
attention reads relative positions, the distances between tokens of the full sequence."""

from __future__ import annotations

from typing import Any

import torch

from .hf_text import HFTextFamily
from .registry import builtin_adapter, hf_classifier


@builtin_adapter("hf-deberta-v2", hf_classifier("DebertaV2ForSequenceClassification"))
class HFDebertaV2Adapter(HFTextFamily):
    family = "Hugging Face DebertaV2ForSequenceClassification (exact mode)"
    base_model = "deberta"
    supported_modes = ("exact",)
    exact_modes = ("exact",)
    mode_refusal = "DeBERTa's relative positions are distances in the full sequence; use mode='exact'"
    position_table = None
    supports_checkpointing = False  # its layers take relative positions: the embedding stops the forward

    def head(self, out: Any) -> torch.Tensor:
        b = self.backbone
        return b.classifier(b.dropout(b.pooler(out.last_hidden_state)))

    def _model_attention_mask(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        return mask  # DeBERTa builds its own mask from [B, T]
