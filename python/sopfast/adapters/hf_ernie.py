"""Hugging Face ``ErnieForSequenceClassification``: BERT's layout, under ``.ernie``."""

from __future__ import annotations

from .hf_text import HFTextFamily
from .registry import builtin_adapter, hf_classifier


@builtin_adapter("hf-ernie", hf_classifier("ErnieForSequenceClassification"))
class HFErnieAdapter(HFTextFamily):
    family = "Hugging Face ErnieForSequenceClassification"
    base_model = "ernie"  # the classifier's attribute that holds the encoder
    # The rest is BERT's, HFTextFamily's defaults; a family whose encoder differs overrides:
    #   token_types = True                                  whether the encoder takes token_type_ids
    #   position_table = "embeddings.position_embeddings"   None: relative positions, exact mode only
    #   def position_offset(self): return 0                 position id of the first column (RoBERTa: pad + 1)
    #   def head(self, out): ...                            logits from the encoder's output
    #   def layers(self, model): return model.encoder.layer
    #   def classifier_weight(self): return self.backbone.classifier.weight
