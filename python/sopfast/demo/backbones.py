"""The demo's small backbone, trained the ordinary way (whole images, no masking), as a user's own
classifier would be; ``sopfast.adapt_backbone`` is the separate, opt-in step that makes a copy of it
predict from groups of its patches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import testing


def small_vit(
    image_size: int, patch_size: int, channels: int, num_labels: int, hidden: int = 64, layers: int = 4, heads: int = 4
) -> nn.Module:
    """The demo's randomly initialised HF ``ViTForImageClassification`` of a few layers (MLP 2× wide)."""
    return testing.vit(
        (hidden, layers, heads),
        image_size=image_size,
        patch_size=patch_size,
        channels=channels,
        num_labels=num_labels,
        mlp=2 * hidden,
        seed=None,
    ).train()


def train_backbone(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int = 3,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = True,
) -> nn.Module:
    """Train an HF image classifier the ordinary way: whole images, cross-entropy, AdamW with a one-cycle
    schedule — no masking (``sopfast.adapt_backbone`` is the separate, opt-in step that adds it)."""
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
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(model(pixel_values=x[idx]).logits, y[idx])
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
        logits = model(pixel_values=x[start : start + batch_size]).logits
        correct += int((logits.argmax(-1) == y[start : start + batch_size]).sum())
    return correct / max(1, len(x))
