"""Small backbones for the demo and tests, and a masking-robust training loop for them.

SOP runs the backbone on inputs with most features masked; a backbone trained with random
patch masking keeps its accuracy there (as large pretrained ViTs do), so the demo trains its
small ViT that way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .adapters.images import pixel_grid_mask


def small_vit(image_size: int, patch_size: int, channels: int, num_labels: int, hidden: int = 64,
              layers: int = 4, heads: int = 4) -> nn.Module:
    """A randomly initialised HF ``ViTForImageClassification`` of a few layers."""
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=2 * hidden,
        image_size=image_size, patch_size=patch_size, num_channels=channels, num_labels=num_labels,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return ViTForImageClassification(cfg)


def random_patch_masks(batch: int, grid: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """``[B, h·w]`` bool masks keeping a uniformly random 10–100 % of the patches."""
    d = grid[0] * grid[1]
    keep = torch.rand(batch, 1, generator=generator) * 0.9 + 0.1
    return torch.rand(batch, d, generator=generator) < keep


def train_masked_backbone(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    grid: tuple[int, int],
    epochs: int = 3,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = True,
) -> nn.Module:
    """Train an image classifier with random patch masking on half of each batch."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    bar = tqdm(total=steps, desc="backbone", disable=not progress)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            xb, yb = x[idx], y[idx]
            half = len(idx) // 2
            masks = random_patch_masks(half, grid, gen)
            xb = torch.cat([xb[:half] * pixel_grid_mask(masks, grid, tuple(xb.shape[-2:])), xb[half:]])
            loss = F.cross_entropy(model(pixel_values=xb).logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    return model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy of a plain HF image classifier."""
    model.eval()
    correct = 0
    for start in range(0, len(x), batch_size):
        logits = model(pixel_values=x[start:start + batch_size]).logits
        correct += int((logits.argmax(-1) == y[start:start + batch_size]).sum())
    return correct / max(1, len(x))
