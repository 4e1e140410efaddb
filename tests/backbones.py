"""Tiny randomly initialised backbones of every supported family, and a text batch."""

from __future__ import annotations

import torch
from torch import nn


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


def make_hf_vit(num_labels: int = 3, seed: int = 0, image_size: int = 32):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    cfg = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=image_size,
        patch_size=8,
        num_labels=num_labels,
    )
    return ViTForImageClassification(cfg).eval()


def make_timm_vit(num_classes: int = 3, seed: int = 0, global_pool: str = "token", image_size: int = 32):
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


def make_bert(num_labels: int = 2, seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=num_labels,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(cfg).eval()


def make_cnn(num_classes: int = 3, seed: int = 0) -> TinyCNN:
    torch.manual_seed(seed)
    return TinyCNN(num_classes).eval()


def text_batch(seed: int = 1, pairs: bool = True):
    """Three sequences of different lengths (padded to 14), optionally with a second segment."""
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
