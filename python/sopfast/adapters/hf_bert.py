"""Adapter for Hugging Face BERT-style sequence classifiers (``BertForSequenceClassification``).

Features are the token positions; a group masks a token by ``input_id → [PAD]`` and
``attention_mask → 0``.  The second segment (``token_type_ids == 1``) is always kept; the
candidate pool is ``attention_mask · (1 − token_type_ids)``.  Keys are the last layer's CLS
state; logits go through the pooler and classifier as usual.

``drop`` runs, per group, only the kept tokens plus position 0 (the CLS query, with its key
masked and its id set to [PAD] when the group does not hold it), with the original position
and token-type ids — exact, since masked keys receive zero attention.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..types import FeatureInputs, GroupPredictions, Groups
from .base import BackboneAdapter, freeze_, run_chunked, trainable_copy
from .hf_common import eager_attention
from .registry import builtin_adapter, class_names


def _layer_attention_mask(model: Any, h: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    """The mask a BERT layer takes: transformers 5.x's ``create_bidirectional_mask``, or the additive
    ``[B, 1, 1, T]`` extended mask of transformers 4.x (which has no ``create_bidirectional_mask``)."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:
        return model.get_extended_attention_mask(attention_mask, attention_mask.shape, dtype=h.dtype)
    return create_bidirectional_mask(config=model.config, inputs_embeds=h, attention_mask=attention_mask)


def _is_hf_bert(model: nn.Module) -> bool:
    return hasattr(model, "bert") and hasattr(model, "classifier") and "PreTrainedModel" in class_names(model)


@builtin_adapter(_is_hf_bert)
class HFBertAdapter(BackboneAdapter):
    family = "Hugging Face BertForSequenceClassification (BERT-style encoders under .bert)"
    modality = "text"
    supported_modes = ("exact", "drop")
    supports_checkpointing = True
    projection_source = "bert"
    has_special_tokens = True

    def __init__(self, backbone: nn.Module):
        super().__init__(backbone)
        self.encoder_model: Any = self.backbone.bert
        pad = self.backbone.config.pad_token_id
        self.pad = int(pad) if pad is not None else 0
        self.pad_token_id = self.pad
        self.max_tokens = int(getattr(self.backbone.config, "max_position_embeddings", 512) or 512)

    def prepare(self, x, attention_mask=None, token_type_ids=None) -> FeatureInputs:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"input_ids must be a [B, T] tensor, got {shape}")
        if x.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be int64 or int32 token ids, got {x.dtype}")
        if attention_mask is None:
            raise ValueError("text backbones need attention_mask ([B, T], 1 for real tokens, 0 for padding)")
        if attention_mask.shape != x.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(x.shape)}"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(x)
        elif token_type_ids.shape != x.shape:
            raise ValueError(
                f"token_type_ids shape {tuple(token_type_ids.shape)} must equal input_ids shape {tuple(x.shape)}"
            )
        self._check_vocabulary(x, token_type_ids)
        return FeatureInputs(
            input_ids=x.long(), attention_mask=attention_mask.long(), token_type_ids=token_type_ids.long()
        )

    def _check_vocabulary(self, ids: torch.Tensor, token_type_ids: torch.Tensor) -> None:
        """Token ids, token types and the length must fit the model's embedding tables."""
        cfg = self.backbone.config
        limits = (("input_ids", ids, cfg.vocab_size), ("token_type_ids", token_type_ids, cfg.type_vocab_size))
        for name, values, size in limits:
            if values.numel() and (int(values.min()) < 0 or int(values.max()) >= size):
                raise ValueError(
                    f"{name} must lie in [0, {size - 1}] for this model, got values in "
                    f"[{int(values.min())}, {int(values.max())}]"
                )
        absolute = getattr(cfg, "position_embedding_type", "absolute") == "absolute"
        if absolute and ids.shape[1] > cfg.max_position_embeddings:
            raise ValueError(
                f"input_ids must have at most {cfg.max_position_embeddings} tokens (the model's positions), "
                f"got {ids.shape[1]}; truncate the text (tokenizer(..., truncation=True))"
            )

    def num_features(self, inputs: FeatureInputs) -> int:
        return int(inputs.require_input_ids().shape[1])

    def candidates(self, inputs: FeatureInputs) -> torch.Tensor:
        first = inputs.require_attention_mask().bool() & (inputs.require_token_type_ids() == 0)
        return first & ~self.special_tokens(inputs) if self.keep_special_tokens else first

    def always_kept(self, inputs: FeatureInputs) -> torch.Tensor:
        """``[B, T]`` bool: the second segment, never masked (with :attr:`keep_special_tokens` also the
        first segment's special tokens)."""
        second = inputs.require_attention_mask().bool() & (inputs.require_token_type_ids() == 1)
        return second | self.special_tokens(inputs) if self.keep_special_tokens else second

    def special_tokens(self, inputs: FeatureInputs) -> torch.Tensor:
        """``[B, T]`` bool: the first segment's special tokens — position 0 ([CLS]), its last token
        ([SEP]) and any token whose id the config names as CLS/SEP/BOS/EOS."""
        ids = inputs.require_input_ids()
        first = inputs.require_attention_mask().bool() & (inputs.require_token_type_ids() == 0)
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        last = torch.where(first, pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)
        out = first & ((pos == 0) | (pos == last))
        for name in ("cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id"):
            token = getattr(self.backbone.config, name, None)
            if token is not None:
                out |= first & (ids == int(token))
        return out

    def blank_features(self, inputs: FeatureInputs) -> torch.Tensor:
        """``[B, T]`` bool: :meth:`special_tokens` (``SOP(demote_blank=True)`` ranks them last)."""
        return self.special_tokens(inputs)

    def tokens_per_group(self, inputs: FeatureInputs, groups: Groups, mode: str) -> int:
        if mode == "exact":
            return groups.mask.shape[-1]
        kept = (groups.mask | self.always_kept(inputs).unsqueeze(1)).sum(dim=-1)
        return int(kept.max()) + 1

    @property
    def embed_dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    def make_projection(self) -> nn.Module:
        projection: Any = trainable_copy(self.encoder_model)
        freeze_(projection.encoder.layer[-1], getattr(projection, "pooler", None))
        return projection

    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        h = projection.embeddings(input_ids=inputs.require_input_ids(), token_type_ids=inputs.require_token_type_ids())
        mask = _layer_attention_mask(projection, h, inputs.require_attention_mask())
        for layer in projection.encoder.layer[:-1]:
            out = self.run_layer(layer, h, mask)
            h = out[0] if isinstance(out, tuple) else out
        return h

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.classifier.weight

    def _encode(self, **batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.encoder_model(**batch)
        pooled = out.pooler_output
        logits = self.backbone.classifier(self.backbone.dropout(pooled))
        return logits, out.last_hidden_state[:, 0]

    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        b, m, t = groups.mask.shape
        keep = (groups.mask | self.always_kept(inputs).unsqueeze(1)).reshape(b * m, t)
        batch = self._exact_batch if mode == "exact" else self._drop_batch
        return run_chunked(groups, chunk_size, lambda rows, example: self._encode(**batch(inputs, example, keep[rows])))

    def _exact_batch(self, inputs: FeatureInputs, example: torch.Tensor, keep: torch.Tensor) -> dict:
        ids = inputs.require_input_ids()[example]
        return {
            "input_ids": torch.where(keep, ids, torch.full_like(ids, self.pad)),
            "attention_mask": inputs.require_attention_mask()[example] * keep,
            "token_type_ids": inputs.require_token_type_ids()[example],
        }

    def _drop_batch(self, inputs: FeatureInputs, example: torch.Tensor, keep: torch.Tensor) -> dict:
        n, t = keep.shape
        runs = keep.clone()
        runs[:, 0] = True
        length = int(runs.sum(dim=1).max())
        positions = torch.arange(t, device=keep.device).expand(n, t)
        order = torch.sort(torch.where(runs, positions, positions + t), dim=1).values[:, :length]
        slot_used = order < t
        pos = torch.where(slot_used, order, torch.zeros_like(order))
        ids = inputs.require_input_ids()[example].gather(1, pos)
        kept_here = keep.gather(1, pos) & slot_used
        return {
            "input_ids": torch.where(kept_here, ids, torch.full_like(ids, self.pad)),
            "attention_mask": (inputs.require_attention_mask()[example].gather(1, pos).bool() & kept_here).long(),
            "token_type_ids": inputs.require_token_type_ids()[example].gather(1, pos),
            "position_ids": pos,
        }

    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.backbone(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            token_type_ids=inputs.token_type_ids,
            output_hidden_states=True,
        )
        return out.logits, out.hidden_states[-1][:, 0]

    def reference_embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        out = projection(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            token_type_ids=inputs.token_type_ids,
            output_hidden_states=True,
        )
        return out.hidden_states[-2]

    def soft_forward(self, inputs: FeatureInputs, presence: torch.Tensor) -> torch.Tensor:
        """Each candidate token's embedding blended with [PAD]'s, ``z·e(id) + (1 − z)·e(pad)``; the
        attention mask is left as it is (a soft stand-in for SOP's hard masking)."""
        emb = self.backbone.get_input_embeddings()
        ids = inputs.require_input_ids()
        z = torch.where(self.candidates(inputs), presence, torch.ones_like(presence)).unsqueeze(-1)
        x = emb(ids) * z + emb(torch.full_like(ids, self.pad)) * (1 - z)
        out = self.backbone(inputs_embeds=x, attention_mask=inputs.attention_mask, token_type_ids=inputs.token_type_ids)
        return out.logits

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return self.encoder_model.encoder.layer[-1], True, 0

    @property
    def has_cls_attention(self) -> bool:
        return True

    def cls_attention(self, inputs: FeatureInputs) -> torch.Tensor:
        with torch.no_grad(), eager_attention(self.backbone):
            out = self.backbone(
                input_ids=inputs.input_ids,
                attention_mask=inputs.attention_mask,
                token_type_ids=inputs.token_type_ids,
                output_attentions=True,
            )
        return out.attentions[-1][:, :, 0].mean(dim=1).float()
