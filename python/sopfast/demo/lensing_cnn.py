"""The cosmology demo's backbone: a CNN that regresses (Ω_m, σ_8) from a convergence map, trained the
ordinary way (whole maps, MSE), as a cosmologist's own network would be.

It is a small CNN of the kind the paper cites for weak lensing (Ribli et al. 2019; Matilla et al.
2020): convolutions with batch normalisation and leaky ReLU, then blocks of two 3×3 convolutions closed
by average pooling, channels doubling from block to block, global average pooling and a dense head with
one output per parameter.  It is smaller than theirs, to train on a CPU in minutes: the first block is
one 6×6 convolution of stride 3 (66 → 22 pixels: fewer operations and far less memory traffic than a
3×3 convolution at full resolution followed by pooling), then two blocks (32 and 64 channels).  On a
66×66 map the second block's output is an 11×11 grid of 6×6-pixel patches: SOP's features
(``feature_layer="block2"``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: The module whose output grid SOP groups (11×11 patches of 6×6 pixels on a 66×66 map).
FEATURE_LAYER = "block2"


def _unit(inputs: int, outputs: int, kernel: int = 3, stride: int = 1, padding: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(inputs, outputs, kernel, stride=stride, padding=padding, bias=False)
    return [conv, nn.BatchNorm2d(outputs), nn.LeakyReLU(0.1)]


def _block(inputs: int, outputs: int, pool: int) -> nn.Sequential:
    layers = _unit(inputs, outputs) + _unit(outputs, outputs)
    return nn.Sequential(*layers, *([nn.AvgPool2d(pool)] if pool > 1 else []))


class LensingCNN(nn.Module):
    """``[B, 1, 66, 66]`` maps → ``[B, outputs]`` (module docstring); ``width`` channels in the first block."""

    def __init__(self, outputs: int = 2, width: int = 16):
        super().__init__()
        self.block1 = nn.Sequential(*_unit(1, width, kernel=6, stride=3, padding=2))  # 66 → 22
        self.block2 = _block(width, 2 * width, 2)  # 22 → 11: SOP's feature grid
        self.block3 = _block(2 * width, 4 * width, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.hidden = nn.Linear(4 * width, 4 * width)
        self.head = nn.Linear(4 * width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(self.block3(self.block2(self.block1(x)))).flatten(1)
        return self.head(F.leaky_relu(self.hidden(h), 0.1))


def train_regressor(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
) -> nn.Module:
    """Train ``model`` on maps ``x [N, 1, H, W]`` and targets ``y [N, C]`` the ordinary way: whole maps,
    MSE, AdamW with a one-cycle schedule, the maps flipped and rotated by multiples of 90° at random (the
    statistics of a convergence map do not change under them)."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.2)
    model.train()
    bar = tqdm(total=steps, desc="backbone", disable=not progress)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            maps = torch.rot90(x[idx], int(torch.randint(4, (1,), generator=gen)), dims=(2, 3))
            if bool(torch.randint(2, (1,), generator=gen)):
                maps = maps.flip(-1)
            loss = F.mse_loss(model(maps), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
    bar.close()
    return model.eval()


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """``[N, C]``: the model on every map (eval mode)."""
    model.eval()
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


def r_squared(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``[C]``: the coefficient of determination of each output, ``1 − SS_res / SS_tot``."""
    residual = (prediction - target).pow(2).sum(0)
    total = (target - target.mean(0)).pow(2).sum(0)
    return 1 - residual / total
