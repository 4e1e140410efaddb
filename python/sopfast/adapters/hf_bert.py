"""Hugging Face ``BertForSequenceClassification`` (and BERT-style classifiers with their encoder under
``.bert``): the base text family (:mod:`sopfast.adapters.hf_text`) as it is."""

from __future__ import annotations

from torch import nn

from .hf_text import HFTextFamily
from .registry import builtin_adapter, class_names


def _is_hf_bert(model: nn.Module) -> bool:
    return hasattr(model, "bert") and hasattr(model, "classifier") and "PreTrainedModel" in class_names(model)


@builtin_adapter("hf-bert", _is_hf_bert)
class HFBertAdapter(HFTextFamily):
    family = "Hugging Face BertForSequenceClassification (BERT-style encoders under .bert)"
