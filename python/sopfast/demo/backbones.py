"""Small backbones for the demo and tests, and a masking-robust training loop for them.

SOP runs the backbone on inputs with most features masked (``exact``) or on a subset of
the tokens (``drop``); a backbone trained with random patch masking and random token
dropping keeps its accuracy there (as large pretrained ViTs do), so the demo trains its small
ViT that way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import testing
from ..adapters import get_adapter
from ..adapters.images import pixel_grid_mask
from ..types import Groups


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


def random_patch_masks(batch: int, grid: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """``[B, h·w]`` bool masks keeping a uniformly random 10–100 % of the patches."""
    d = grid[0] * grid[1]
    keep = torch.rand(batch, 1, generator=generator) * 0.9 + 0.1
    return torch.rand(batch, d, generator=generator) < keep


def forward_kept_tokens(model: nn.Module, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, C]`` of a ViT backbone run on its class token plus the patches ``keep [B, k]``
    (ascending positions): the adapter's ``drop`` group pass, with gradients."""
    adapter = get_adapter(model)
    inputs = adapter.prepare(x)
    mask = torch.zeros(len(x), adapter.num_features(inputs), dtype=torch.bool, device=x.device)
    groups = Groups.from_masks(mask.scatter(1, keep, True).unsqueeze(1))
    return adapter.run_groups(inputs, groups, "drop", len(x)).logits[:, 0]


def _augmented_logits(model: nn.Module, x: torch.Tensor, grid: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """A third of the batch with masked pixels, a third with dropped tokens, a third intact."""
    third = len(x) // 3
    d = grid[0] * grid[1]
    masks = random_patch_masks(third, grid, gen)
    masked = x[:third] * pixel_grid_mask(masks, grid, (int(x.shape[-2]), int(x.shape[-1])))
    k = int(torch.randint(max(1, d // 10), d + 1, (1,), generator=gen))
    keep = torch.rand(third, d, generator=gen).argsort(dim=1)[:, :k].sort(dim=1).values
    dropped = forward_kept_tokens(model, x[third : 2 * third], keep)
    rest = model(pixel_values=torch.cat([masked, x[2 * third :]])).logits
    return torch.cat([rest[:third], dropped, rest[third:]])


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
    """Train an HF ViT with random patch masking and token dropping (see :func:`_augmented_logits`)."""
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
            loss = F.cross_entropy(_augmented_logits(model, x[idx], grid, gen), y[idx])
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
