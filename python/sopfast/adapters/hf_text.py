"""Hugging Face text classifiers (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, DeBERTa-v2 …) as one
parameterised family, :class:`HFTextFamily`.

Features are the token positions; a group masks a token by ``input_id → [PAD]`` and
``attention_mask → 0``.  The second segment (``token_type_ids == 1``) is always kept; the
candidate pool is ``attention_mask · (1 − token_type_ids)``.  Keys are the last layer's first-token
([CLS]) state; logits go through the family's head (:meth:`HFTextFamily.head`).

Every pass runs its tokens at the positions they have in the input: ``position_offset`` plus the column
(RoBERTa counts from ``pad_token_id + 1``; its own rule, counting the non-[PAD] tokens, would move the
tokens after a masked one).  ``drop`` runs, per group, only the kept tokens plus position 0 (the CLS
query, with its key masked and its id set to [PAD] when the group does not hold it), at those positions
— exact for absolute positions, since masked keys receive zero attention; a family with relative
positions (``position_table = None``) runs ``exact`` only.

A family sets: ``base_model`` (the classifier's attribute holding the encoder), ``token_types`` (whether
the encoder takes ``token_type_ids``), ``position_table`` and ``position_offset``, :meth:`head`, and
:meth:`layers`; its generator embedding walks the layers (BERT-like encoders, with activation
checkpointing) or, with ``supports_checkpointing = False``, stops the encoder's own forward before its
last layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_values
from ..types import FeatureInputs, GroupPredictions, Groups, HostValues
from .base import BackboneAdapter, StopForward, freeze_, run_chunked, trainable_copy
from .flops import TransformerSize, hf_transformer_size
from .hf_common import eager_attention
from .images import parameter_dtype


@cache
def _bidirectional_mask_maker() -> Any:
    """transformers 5.x's ``create_bidirectional_mask``, or ``None`` on 4.x (which has none)."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:
        return None
    return create_bidirectional_mask


def _attention_mask_4d(config: Any, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``mask [B, T]`` (1: attend) as the ``[B, 1, 1, T]`` mask transformers 5.x's SDPA (bool) or eager
    attention (additive: 0 or ``dtype``'s lowest) takes, ``None`` for other attention kernels.  Built here
    because transformers' ``create_bidirectional_mask`` reads the mask on the host (a GPU sync) to drop it
    when nothing is padded; a 4-D mask passes through it unread."""
    attend = mask.bool()[:, None, None, :]
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation == "sdpa":
        return attend
    if implementation == "eager":
        return torch.zeros(attend.shape, dtype=dtype, device=mask.device).masked_fill_(~attend, torch.finfo(dtype).min)
    return None


def _layer_attention_mask(model: Any, h: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    """The mask a BERT layer takes: :func:`_attention_mask_4d` on transformers 5.x (``create_bidirectional_mask``
    for attention kernels other than SDPA and eager), the additive ``[B, 1, 1, T]`` extended mask on 4.x."""
    create = _bidirectional_mask_maker()
    if create is None:
        return model.get_extended_attention_mask(attention_mask, attention_mask.shape, dtype=h.dtype)
    built = _attention_mask_4d(model.config, attention_mask, h.dtype)
    return built if built is not None else create(config=model.config, inputs_embeds=h, attention_mask=attention_mask)


def _check_ids(name: str, values: torch.Tensor, size: int) -> None:
    """``values`` (ids into a table of ``size`` rows) in ``[0, size)``; ValueError (on a GPU a device-side
    assertion) otherwise."""
    if values.numel():
        low, high = torch.aminmax(values)
        check_values(
            (low >= 0) & (high < size),
            f"{name} must lie in [0, {size - 1}] for this model",
            lambda: f", got values in [{int(low)}, {int(high)}]",
        )


def _runs(keep: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` bool: the tokens a ``drop`` group pass runs, ``keep [N, T]`` and always [CLS] (position 0)."""
    runs = keep.clone()
    runs[:, 0] = True
    return runs


def _drop_lengths(runs: torch.Tensor) -> list[int]:
    """Tokens each ``drop`` group pass runs, on the host, counted after the groups are made: a host read that
    waits for the projection pass (a GPU sync).  Only for groups without :attr:`Groups.drop_widths` (made
    outside ``SOP.make_groups``)."""
    return runs.sum(dim=1).tolist()


def _hidden_states_argument(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    """The hidden states a layer is called with: its first positional argument, or the keyword."""
    if args:
        return args[0]
    return next(kwargs[k] for k in ("hidden_states", "hidden_state", "x") if k in kwargs)


class HFTextFamily(BackboneAdapter):
    """A Hugging Face sequence classifier over a Transformer encoder (module docstring)."""

    modality = "text"
    supported_modes: tuple[str, ...] = ("exact", "drop")
    exact_modes: tuple[str, ...] = ("exact", "drop")
    supports_checkpointing = True
    has_special_tokens = True
    #: The classifier's attribute holding the encoder model.
    base_model = "bert"
    #: Whether the encoder takes ``token_type_ids`` (the segments are read from them either way).
    token_types = True
    #: The encoder's absolute position table (a ``get_submodule`` path); ``None``: relative positions.
    position_table: str | None = "embeddings.position_embeddings"

    def __init__(self, backbone: nn.Module):
        super().__init__(backbone)
        self.encoder_model: Any = getattr(self.backbone, self.base_model)
        self.projection_source = self.base_model
        cfg = self.backbone.config
        pad = cfg.pad_token_id
        self.pad = int(pad) if pad is not None else 0
        self.pad_token_id = self.pad
        self.max_tokens = int(getattr(cfg, "max_position_embeddings", 512) or 512) - self.position_offset()

    # -- what a family says ---------------------------------------------------------------------
    def position_offset(self) -> int:
        """The position id of the first column (0; RoBERTa: ``pad_token_id + 1``)."""
        return 0

    def layers(self, model: Any) -> nn.ModuleList:
        """The encoder's layers (of ``model``, the encoder or its trainable copy)."""
        return model.encoder.layer

    def last_layer_calls(self, model: Any) -> int:
        """How often the last of :meth:`layers` runs in one forward (ALBERT shares layers)."""
        return 1

    def head(self, out: Any) -> torch.Tensor:
        """Logits from the encoder's output ``out`` (BERT: the classifier on the pooled [CLS] state)."""
        return self.backbone.classifier(self.backbone.dropout(out.pooler_output))

    def embedding_output(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """What the first layer gets (positions pinned by the caller), for the layer walk of :meth:`embed`."""
        return model.embeddings(input_ids=input_ids, **self._types(token_type_ids))

    # -- inputs ---------------------------------------------------------------------------------
    def prepare(self, x, attention_mask=None, token_type_ids=None) -> FeatureInputs:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"input_ids must be a [B, T] tensor, got {shape}")
        if x.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be int64 or int32 token ids, got {x.dtype}")
        if attention_mask is None:
            raise ValueError("text backbones need attention_mask ([B, T], 1 for real tokens, 0 for padding)")
        if x.shape[1] == 0:
            raise ValueError(f"input_ids must hold at least one token per text, got shape {tuple(x.shape)}")
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != x.shape:
            raise ValueError(
                f"attention_mask shape {tuple(getattr(attention_mask, 'shape', ()))} must equal input_ids shape "
                f"{tuple(x.shape)}"
            )
        if attention_mask.numel():
            check_values(
                ((attention_mask == 0) | (attention_mask == 1)).all(),
                "attention_mask must hold only the values {0, 1} (1 = a real token, 0 = padding)",
                lambda: f", got {sorted(set(attention_mask.flatten().tolist()) - {0, 1})[:5]}",
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
        """Token ids, token types (segments 0 and 1 where the model has no type table) and the length must
        fit the model's embedding tables."""
        cfg = self.backbone.config
        types = int(getattr(cfg, "type_vocab_size", 0) or 0) if self.token_types else 0
        for name, values, size in (("input_ids", ids, cfg.vocab_size), ("token_type_ids", token_type_ids, types or 2)):
            _check_ids(name, values, size)
        absolute = getattr(cfg, "position_embedding_type", "absolute") == "absolute"
        limit = self.max_tokens
        if self.position_table is not None and absolute and limit is not None and ids.shape[1] > limit:
            raise ValueError(
                f"input_ids must have at most {limit} tokens (the model's positions), "
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
        return max(self._drop_pass_widths(inputs, groups))

    def compile_units(self, projection: nn.Module) -> list[nn.Module]:
        return [*self.layers(self.encoder_model), *self.layers(projection)]

    def drop_widths(self, inputs: FeatureInputs, tau: float) -> HostValues:
        """Per example ``[floor(τ·d) + 1, a]``: ``d`` its candidates (a group keeps at most
        ``max(1, floor(τ·d))`` of them; the ``+ 1`` also covers floating point's floor), ``a`` the tokens
        every pass runs besides the group (the always-kept ones and position 0) — from the inputs alone, so
        the copy starts before the projection pass and the group passes need no GPU sync."""
        always = self.always_kept(inputs).clone()
        always[:, 0] = True
        kept = torch.floor(self.candidates(inputs).sum(dim=1, dtype=torch.float64) * tau).long() + 1
        return HostValues(torch.stack([kept, always.sum(dim=1)], dim=1))

    def _drop_pass_widths(self, inputs: FeatureInputs, groups: Groups, runs: torch.Tensor | None = None) -> list[int]:
        """``[B·m]`` widths of the ``drop`` passes on the host: from :attr:`Groups.drop_widths` where the groups
        carry them (``min(T, min(k_max, floor(τ·d) + 1) + a)``, an upper bound: the passes are padded with
        masked slots, which leave [CLS]'s result unchanged since masked keys get zero attention), else the
        exact counts (:func:`_drop_lengths` of ``runs``, :func:`_runs` when not given; a GPU sync)."""
        b, m, t = groups.mask.shape
        bounds = None if groups.drop_widths is None else groups.drop_widths.values()
        if bounds is None or len(bounds) != b:  # groups made elsewhere, or of other rows
            return _drop_lengths(_runs(self._keep(inputs, groups)) if runs is None else runs)
        k_max = groups.indices.shape[-1]
        return [min(t, min(k_max, kept) + always) for kept, always in bounds for _ in range(m)]

    def drop_tokens(self, inputs: FeatureInputs, kept: int) -> int:
        """The kept features, the tokens that are no candidates and position 0 ([CLS]), which always runs."""
        first_is_candidate = int(self.candidate_mask(inputs)[0, 0])
        return super().drop_tokens(inputs, kept) + first_is_candidate

    def transformer_size(self) -> TransformerSize:
        return hf_transformer_size(self.backbone.config)

    # -- the model's calls, at the input's positions --------------------------------------------
    def _types(self, token_type_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {"token_type_ids": token_type_ids} if self.token_types and token_type_ids is not None else {}

    def positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` position ids of the columns of ``input_ids``."""
        t = input_ids.shape[1]
        return torch.arange(self.position_offset(), self.position_offset() + t, device=input_ids.device).expand_as(
            input_ids
        )

    @contextmanager
    def positions_at(self, model: Any, position_ids: torch.Tensor) -> Iterator[None]:
        """Every forward of ``model`` (the classifier, its encoder or a copy) inside reads its position table
        at ``position_ids [N, T]`` (a hook on the table, which each family's own forward reads in its own way)."""
        if self.position_table is None:
            yield
            return
        table = (model if hasattr(model, "embeddings") else getattr(model, self.base_model)).get_submodule(
            self.position_table
        )
        used: list[bool] = []

        def hook(module: Any, _args: Any, _out: Any) -> torch.Tensor:
            used.append(True)
            return F.embedding(position_ids, module.weight)

        handle = table.register_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()
        if not used:
            raise RuntimeError(
                f"{type(self).__name__}: the model did not read its position table {self.position_table}"
            )

    def _model_attention_mask(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """The ``attention_mask`` to give the backbone (or its encoder) for ``mask [B, T]``: the 4-D mask of
        :func:`_attention_mask_4d` on transformers 5.x (no host read), ``mask`` itself on 4.x or for other
        attention kernels."""
        if mask is None or _bidirectional_mask_maker() is None:
            return mask
        dtype = parameter_dtype(self.backbone) or torch.float32
        built = _attention_mask_4d(self.backbone.config, mask, dtype)
        return mask if built is None else built

    def _call(self, model: Any, inputs: FeatureInputs, **extra: Any) -> Any:
        """``model`` (classifier or encoder) on ``inputs`` at their positions."""
        ids = inputs.require_input_ids()
        with self.positions_at(model, self.positions(ids)):
            return model(
                input_ids=ids,
                attention_mask=self._model_attention_mask(inputs.attention_mask),
                **self._types(inputs.token_type_ids),
                **extra,
            )

    # -- generator ------------------------------------------------------------------------------
    @property
    def embed_dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    def make_projection(self) -> nn.Module:
        projection: Any = trainable_copy(self.encoder_model)
        last = self.layers(projection)[-1] if self.last_layer_calls(projection) == 1 else None
        freeze_(last, getattr(projection, "pooler", None))
        return projection

    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        if not self.supports_checkpointing:
            return self._before_last_layer(projection, inputs)
        ids = inputs.require_input_ids()
        with self.positions_at(projection, self.positions(ids)):
            h = self.embedding_output(projection, ids, inputs.require_token_type_ids())
        mask = _layer_attention_mask(projection, h, inputs.require_attention_mask())
        for layer in self.layers(projection)[:-1]:
            out = self.run_layer(layer, h, mask)
            h = out[0] if isinstance(out, tuple) else out
        return h

    def _before_last_layer(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        """The hidden states entering the last layer's last call: the encoder's own forward, stopped there."""
        captured: list[torch.Tensor] = []
        calls = self.last_layer_calls(projection)

        def hook(_module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            captured.append(_hidden_states_argument(args, kwargs))
            if len(captured) == calls:
                raise StopForward

        handle = self.layers(projection)[-1].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            self._call(projection, inputs)
        except StopForward:
            pass
        finally:
            handle.remove()
        return captured[-1]

    def reference_embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        return self._call(projection, inputs, output_hidden_states=True).hidden_states[-2]

    # -- group passes ---------------------------------------------------------------------------
    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.classifier.weight

    def _encode(
        self, attention_mask: torch.Tensor, position_ids: torch.Tensor, **batch: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with self.positions_at(self.encoder_model, position_ids):
            out = self.encoder_model(attention_mask=self._model_attention_mask(attention_mask), **batch)
        return self.head(out), out.last_hidden_state[:, 0]

    def _keep(self, inputs: FeatureInputs, groups: Groups) -> torch.Tensor:
        """``[B·m, T]`` bool: the tokens each group pass keeps (its features and the always-kept tokens)."""
        b, m, t = groups.mask.shape
        return (groups.mask | self.always_kept(inputs).unsqueeze(1)).reshape(b * m, t)

    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        return self.run_groups_sized(inputs, groups, mode, lambda _tokens: chunk_size)

    def run_groups_sized(
        self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size_for: Callable[[int], int]
    ) -> GroupPredictions:
        keep = self._keep(inputs, groups)
        if mode == "exact":
            return run_chunked(
                groups,
                chunk_size_for(keep.shape[1]),
                lambda rows, example: self._encode(**self._exact_batch(inputs, example, keep[rows])),
            )
        runs = _runs(keep)
        lengths = self._drop_pass_widths(inputs, groups, runs)
        return run_chunked(
            groups,
            chunk_size_for(max(lengths)),
            lambda rows, example: self._encode(
                **self._drop_batch(inputs, example, keep[rows], runs[rows], max(lengths[rows]))
            ),
        )

    def _exact_batch(self, inputs: FeatureInputs, example: torch.Tensor, keep: torch.Tensor) -> dict:
        ids = inputs.require_input_ids()[example]
        return {
            "input_ids": torch.where(keep, ids, torch.full_like(ids, self.pad)),
            "attention_mask": inputs.require_attention_mask()[example] * keep,
            "position_ids": self.positions(ids),
            **self._types(inputs.require_token_type_ids()[example]),
        }

    def _drop_batch(
        self, inputs: FeatureInputs, example: torch.Tensor, keep: torch.Tensor, runs: torch.Tensor, length: int
    ) -> dict:
        """The ``length`` tokens (``runs [n, T]``, padded) of each group pass, at their original positions."""
        n, t = keep.shape
        columns = torch.arange(t, device=keep.device).expand(n, t)
        order = torch.sort(torch.where(runs, columns, columns + t), dim=1).values[:, :length]
        slot_used = order < t
        pos = torch.where(slot_used, order, torch.zeros_like(order))
        ids = inputs.require_input_ids()[example].gather(1, pos)
        kept_here = keep.gather(1, pos) & slot_used
        return {
            "input_ids": torch.where(kept_here, ids, torch.full_like(ids, self.pad)),
            "attention_mask": (inputs.require_attention_mask()[example].gather(1, pos).bool() & kept_here).long(),
            "position_ids": pos + self.position_offset(),
            **self._types(inputs.require_token_type_ids()[example].gather(1, pos)),
        }

    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._call(self.backbone, inputs, output_hidden_states=True)
        return out.logits, out.hidden_states[-1][:, 0]

    # -- optional hooks -------------------------------------------------------------------------
    def soft_forward(self, inputs: FeatureInputs, presence: torch.Tensor) -> torch.Tensor:
        """Each candidate token's embedding blended with [PAD]'s, ``z·e(id) + (1 − z)·e(pad)``; the
        attention mask is left as it is (a soft stand-in for SOP's hard masking)."""
        emb = self.backbone.get_input_embeddings()
        ids = inputs.require_input_ids()
        z = torch.where(self.candidates(inputs), presence, torch.ones_like(presence)).unsqueeze(-1)
        x = (emb(ids) * z + emb(torch.full_like(ids, self.pad)) * (1 - z)).to(emb.weight.dtype)
        mask = self._model_attention_mask(inputs.attention_mask)
        with self.positions_at(self.backbone, self.positions(ids)):
            return self.backbone(inputs_embeds=x, attention_mask=mask, **self._types(inputs.token_type_ids)).logits

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return self.layers(self.encoder_model)[-1], True, 0

    @property
    def has_cls_attention(self) -> bool:
        return True

    def cls_attention(self, inputs: FeatureInputs) -> torch.Tensor:
        with torch.no_grad(), eager_attention(self.backbone):
            ids = inputs.require_input_ids()
            with self.positions_at(self.backbone, self.positions(ids)):
                out = self.backbone(
                    input_ids=ids,
                    attention_mask=inputs.attention_mask,
                    **self._types(inputs.token_type_ids),
                    output_attentions=True,
                )
        return out.attentions[-1][:, :, 0].mean(dim=1).float()
