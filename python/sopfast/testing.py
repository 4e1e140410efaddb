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
