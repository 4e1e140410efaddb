"""Randomly initialised backbones of every supported family, for tests, benchmarks and examples.

The one place that builds them: tiny ones that run in milliseconds (:func:`make_hf_vit`,
:func:`make_timm_vit`, :func:`make_bert`, :func:`make_cnn`, :func:`text_batch`) and the standard
sizes the benchmarks time (:func:`vit`, :func:`bert` with :data:`VIT_SIZES` / :data:`BERT_SIZES`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

# (hidden size, layers, attention heads); the MLP is 4× the hidden size
VIT_SIZES = {"tiny": (192, 4, 3), "small": (384, 6, 6), "b16": (768, 12, 12), "bench-small": (192, 6, 3)}
BERT_SIZES = {"small": (256, 4, 4), "base": (768, 12, 12)}


def vit(
    size: str | tuple[int, int, int] = "b16",
    *,
    image_size: int = 224,
    patch_size: int = 16,
    channels: int = 3,
    num_labels: int = 1000,
    dropout: float = 0.0,
    mlp: int | None = None,
    seed: int | None = 0,
) -> Any:
    """A randomly initialised HF ``ViTForImageClassification`` (eval mode) of a named size or
    ``(hidden, layers, heads)``."""
    from transformers import ViTConfig, ViTForImageClassification

    hidden, layers, heads = VIT_SIZES[size] if isinstance(size, str) else size
    if seed is not None:
        torch.manual_seed(seed)
    cfg = ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=mlp or 4 * hidden,
        image_size=image_size,
        patch_size=patch_size,
        num_channels=channels,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    # ``num_labels`` is a property of every config (it sets ``id2label``); transformers 5.x's typed
    # config signatures leave it out of ``__init__``, so it is set here, the same on 4.x and 5.x.
    cfg.num_labels = num_labels
    return ViTForImageClassification(cfg).eval()


def bert(
    size: str | tuple[int, int, int] = "base",
    *,
    vocab_size: int = 30522,
    max_positions: int = 512,
    num_labels: int = 2,
    dropout: float = 0.0,
    mlp: int | None = None,
    seed: int | None = 0,
) -> Any:
    """A randomly initialised HF ``BertForSequenceClassification`` (eval mode) of a named size or
    ``(hidden, layers, heads)``."""
    from transformers import BertConfig, BertForSequenceClassification

    hidden, layers, heads = BERT_SIZES[size] if isinstance(size, str) else size
    if seed is not None:
        torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=mlp or 4 * hidden,
        max_position_embeddings=max_positions,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    cfg.num_labels = num_labels
    return BertForSequenceClassification(cfg).eval()


def resnet18(num_classes: int = 10, seed: int | None = 0) -> nn.Module:
    """torchvision's ResNet-18, randomly initialised (eval mode); its feature layer is ``layer3``."""
    from torchvision.models import resnet18 as build

    if seed is not None:
        torch.manual_seed(seed)
    return build(num_classes=num_classes).eval()


# -- tiny ones ----------------------------------------------------------------------------------------
class TinyCNN(nn.Module):
    """16×16 RGB → 8×8 feature grid (``features``) → 3 classes."""

    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(16, 12)
        self.fc = nn.Linear(12, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(self.features(x)).flatten(1)
        return self.fc(torch.relu(self.fc1(h)))


def make_hf_vit(num_labels: int = 3, seed: int = 0, image_size: int = 32) -> Any:
    """A 2-layer, 32-wide HF ViT on ``image_size`` images in 8-pixel patches."""
    return vit((32, 2, 2), image_size=image_size, patch_size=8, num_labels=num_labels, mlp=64, seed=seed)


def make_timm_vit(
    num_classes: int = 3, seed: int = 0, global_pool: Literal["token", "avg"] = "token", image_size: int = 32
) -> nn.Module:
    """A 2-layer, 32-wide timm ``VisionTransformer`` on ``image_size`` images in 8-pixel patches."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(
        img_size=image_size,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=num_classes,
        global_pool=global_pool,
        class_token=global_pool == "token",
    ).eval()


def make_bert(num_labels: int = 2, seed: int = 0) -> Any:
    """A 2-layer, 32-wide BERT over a 60-token vocabulary and 64 positions."""
    return bert((32, 2, 2), vocab_size=60, max_positions=64, num_labels=num_labels, mlp=64, seed=seed)


def make_cnn(num_classes: int = 3, seed: int = 0) -> TinyCNN:
    """A :class:`TinyCNN` (feature layer ``features``)."""
    torch.manual_seed(seed)
    return TinyCNN(num_classes).eval()


def text_batch(seed: int = 1, pairs: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three sequences of different lengths (padded to 14), optionally with a second segment, for
    :func:`make_bert`: ``input_ids``, ``attention_mask``, ``token_type_ids`` ``[3, 14]``."""
    g = torch.Generator().manual_seed(seed)
    lengths, seconds = [14, 11, 8], ([4, 3, 0] if pairs else [0, 0, 0])
    ids = torch.randint(5, 60, (3, 14), generator=g)
    mask = torch.zeros(3, 14, dtype=torch.long)
    types = torch.zeros(3, 14, dtype=torch.long)
    for i, (n, s) in enumerate(zip(lengths, seconds)):
        mask[i, :n] = 1
        ids[i, 0] = 2
        ids[i, n - 1] = 3
        types[i, n - s : n] = 1
        ids[i, n:] = 0
    return ids, mask, types


# -- tiny Hugging Face classifiers of every family (hidden 32, 2 layers, no dropout) -----------------
_VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32)
_VISION_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_TEXT = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
_TEXT_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
#: ``family name → (config class, model class, config arguments)`` for :func:`make_hf`; images are 32×32
#: RGB, texts fit :func:`text_batch`.
TINY_HF: dict[str, tuple[str, str, dict[str, Any]]] = {
    "hf-vit": ("ViTConfig", "ViTForImageClassification", {**_VISION, **_VISION_DROPOUT, "patch_size": 8}),
    "hf-deit": ("DeiTConfig", "DeiTForImageClassification", {**_VISION, **_VISION_DROPOUT, "patch_size": 8}),
    "hf-beit": (
        "BeitConfig",
        "BeitForImageClassification",
        {**_VISION, **_VISION_DROPOUT, "patch_size": 8, "use_relative_position_bias": True, "drop_path_rate": 0.0},
    ),
    "hf-dinov2": (
        "Dinov2Config",
        "Dinov2ForImageClassification",
        {
            **{k: v for k, v in _VISION.items() if k != "intermediate_size"},
            **_VISION_DROPOUT,
            "patch_size": 8,
            "mlp_ratio": 2,
        },
    ),
    "hf-swin": (
        "SwinConfig",
        "SwinForImageClassification",
        dict(
            embed_dim=16,
            depths=[1, 1, 1],
            num_heads=[1, 2, 2],
            image_size=32,
            patch_size=2,
            window_size=4,
            drop_path_rate=0.0,
            **_VISION_DROPOUT,
        ),
    ),
    "hf-resnet": (
        "ResNetConfig",
        "ResNetForImageClassification",
        dict(embedding_size=8, hidden_sizes=[8, 16, 32], depths=[1, 1, 1]),
    ),
    "hf-convnext": (
        "ConvNextConfig",
        "ConvNextForImageClassification",
        dict(num_stages=3, hidden_sizes=[8, 16, 32], depths=[1, 1, 1]),
    ),
    "hf-bert": (
        "BertConfig",
        "BertForSequenceClassification",
        {**_TEXT, **_TEXT_DROPOUT, "max_position_embeddings": 64},
    ),
    "hf-ernie": (
        "ErnieConfig",
        "ErnieForSequenceClassification",
        {**_TEXT, **_TEXT_DROPOUT, "max_position_embeddings": 64},
    ),
    "hf-roberta": (
        "RobertaConfig",
        "RobertaForSequenceClassification",
        {**_TEXT, **_TEXT_DROPOUT, "max_position_embeddings": 66},
    ),
    "hf-xlm-roberta": (
        "XLMRobertaConfig",
        "XLMRobertaForSequenceClassification",
        {**_TEXT, **_TEXT_DROPOUT, "max_position_embeddings": 66},
    ),
    "hf-distilbert": (
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        dict(
            vocab_size=60,
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=64,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            seq_classif_dropout=0.0,
        ),
    ),
    "hf-albert": (
        "AlbertConfig",
        "AlbertForSequenceClassification",
        {**_TEXT, **_TEXT_DROPOUT, "embedding_size": 16, "max_position_embeddings": 64, "classifier_dropout_prob": 0.0},
    ),
    "hf-electra": (
        "ElectraConfig",
        "ElectraForSequenceClassification",
        {**_TEXT, **_TEXT_DROPOUT, "embedding_size": 16, "max_position_embeddings": 64},
    ),
    "hf-deberta-v2": (
        "DebertaV2Config",
        "DebertaV2ForSequenceClassification",
        {
            **_TEXT,
            **_TEXT_DROPOUT,
            "max_position_embeddings": 64,
            "relative_attention": True,
            "position_biased_input": False,
            "pos_att_type": ["p2c", "c2p"],
            "position_buckets": 8,
            "pooler_dropout": 0.0,
        },
    ),
}


def make_hf(family: str, num_labels: int | None = None, seed: int = 0) -> Any:
    """A tiny randomly initialised Hugging Face classifier of ``family`` (a key of :data:`TINY_HF`), in eval
    mode, with ``num_labels`` classes (default: 3 for images, 2 for texts)."""
    import transformers

    config_name, model_name, arguments = TINY_HF[family]
    cfg = getattr(transformers, config_name)(**arguments)
    cfg.num_labels = num_labels if num_labels is not None else (3 if "ImageClassification" in model_name else 2)
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(cfg).eval()
