"""Checkpoints as the authors' own code writes them (BrachioLab ``exlib``, ``src/exlib/modules/sop.py``).

Their ``SOPConfig`` is a ``transformers.PretrainedConfig`` and their ``SOPImageCls`` a
``PreTrainedModel``; a checkpoint is whatever ``save_pretrained`` makes of them.  This module
rebuilds both classes' saved shape — the config's constructor defaults, the module tree
(``blackbox_model`` and ``projection`` under their ``WrappedModel`` wrappers, ``class_weights``,
``input_attn.multihead_attns.{h}`` and ``output_attn.multihead_attn`` with ``input_weights`` and an
unused ``output_projection``) — and lets the installed transformers write the files: so the
config holds ``id2label``/``label2id`` (nothing for 2 labels), never ``num_labels``, plus
``architectures``, the dtype entry and ``transformers_version`` of that generation.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

import sopfast


class SOPConfig(PretrainedConfig):
    """The authors' ``SOPConfig``: the same keyword arguments and defaults."""

    def __init__(
        self,
        json_file=None,
        hidden_size=512,
        input_hidden_size=None,
        num_labels=2,
        projected_input_scale=1,
        num_heads=1,
        num_masks_sample=20,
        num_masks_max=200,
        image_size=(224, 224),
        num_channels=3,
        attn_patch_size=16,
        finetune_layers=(),
        class_weight_layer=None,
        group_gen_scale=1,
        group_sel_scale=1,
        group_gen_blur_ks1=-1,
        group_gen_blur_sigma1=-1,
        group_gen_blur_ks2=-1,
        group_gen_blur_sigma2=-1,
        freeze_projection=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.input_hidden_size = input_hidden_size
        self.num_labels = num_labels
        self.projected_input_scale = projected_input_scale
        self.num_heads = num_heads
        self.num_masks_sample = num_masks_sample
        self.num_masks_max = num_masks_max
        self.image_size = image_size
        self.num_channels = num_channels
        self.attn_patch_size = attn_patch_size
        self.finetune_layers = list(finetune_layers)
        self.class_weight_layer = class_weight_layer
        self.group_gen_scale = group_gen_scale
        self.group_sel_scale = group_sel_scale
        self.group_gen_blur_ks1 = group_gen_blur_ks1
        self.group_gen_blur_sigma1 = group_gen_blur_sigma1
        self.group_gen_blur_ks2 = group_gen_blur_ks2
        self.group_gen_blur_sigma2 = group_gen_blur_sigma2
        self.freeze_projection = freeze_projection
        self.json_file = json_file
        if self.class_weight_layer is None:
            self.class_weight_layer = self.finetune_layers[0] if self.finetune_layers else "classifier"


class Wrapped(nn.Module):
    """The authors' ``WrappedModel``: the backbone under ``.model``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


class AttentionWeights(nn.Module):
    """``MultiHeadedAttentionBlur`` / ``SparseMultiHeadedAttention``: their parameters only."""

    def __init__(self, input_weights: torch.Tensor):
        super().__init__()
        e = input_weights.shape[1]
        self.input_weights = nn.Parameter(input_weights.detach().clone())
        self.output_projection = nn.Linear(e, e, bias=False)


class GenerateLayer(nn.Module):
    def __init__(self, heads: list[torch.Tensor]):
        super().__init__()
        self.multihead_attns = nn.ModuleList(AttentionWeights(w) for w in heads)


class SelectLayer(nn.Module):
    def __init__(self, input_weights: torch.Tensor):
        super().__init__()
        self.multihead_attn = AttentionWeights(input_weights)


class SOPImageCls(PreTrainedModel):
    """The saved shape of the authors' ``SOPImageCls`` holding the weights of a sopfast model."""

    config_class = SOPConfig

    def __init__(self, config: SOPConfig, model: sopfast.SOP):
        super().__init__(config)
        e = model.adapter.embed_dim
        sel = model.selector
        self.blackbox_model = Wrapped(copy.deepcopy(model.backbone))
        projection = copy.deepcopy(model.backbone)
        projection.vit.load_state_dict(model.projection.state_dict())
        self.projection = Wrapped(Wrapped(projection))
        self.class_weights = nn.Parameter(sel.class_queries.detach().clone())
        self.input_attn = GenerateLayer([w.detach() for w in model.generator.heads])
        values = torch.randn(e, e)
        self.output_attn = SelectLayer(
            torch.cat([values, sel.key_proj.weight.detach(), sel.query_proj.weight.detach()])
        )


def authors_config(model: sopfast.SOP, input_scale: float, **changes) -> SOPConfig:
    """The ``SOPConfig`` the authors would train ``model`` with (``group_gen_scale`` divided by
    ``input_scale²``: their ``projected_input_scale`` multiplies keys and queries)."""
    backbone = model.backbone.config
    options = dict(
        hidden_size=model.adapter.embed_dim,
        num_labels=model.num_classes,
        num_heads=model.generator.num_heads,
        num_masks_sample=model.num_groups,
        image_size=backbone.image_size,
        num_channels=backbone.num_channels,
        attn_patch_size=backbone.patch_size,
        finetune_layers=["model.classifier"],
        group_gen_scale=model.generator.scale / input_scale**2,
        group_sel_scale=model.selector.scale,
        group_gen_blur_ks1=model.generator.blur_kernel_size or -1,
        group_gen_blur_sigma1=model.generator.blur_sigma if model.generator.blur_kernel_size else -1,
        projected_input_scale=input_scale,
    )
    return SOPConfig(**{**options, **changes})


def save_as_authors(
    model: sopfast.SOP,
    directory: Path,
    *,
    input_scale: float = 2.0,
    safe_serialization: bool = True,
    max_shard_size: str | None = None,
    **config_changes,
) -> Path:
    """``model`` saved by ``save_pretrained`` of the authors' classes (sharded with ``max_shard_size``)."""
    authors = SOPImageCls(authors_config(model, input_scale, **config_changes), model)
    options = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    try:
        authors.save_pretrained(directory, safe_serialization=safe_serialization, **options)
    except TypeError:  # transformers 5 always writes safetensors and has no safe_serialization flag
        if not safe_serialization:
            raise
        authors.save_pretrained(directory, **options)
    return Path(directory)
