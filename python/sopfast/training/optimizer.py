"""The optimizer and learning-rate schedule of a run: AdamW on the trainable parameters, linear warm-up,
then the configured decay — restarted in every phase when a multi-head generator trains head by head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..devices import adamw
from ..model.sop import SOP
from ..schedules import lr_factor
from .config import TrainConfig


@dataclass
class Optimization:
    """``optimizer`` and ``scheduler``; ``warmup_steps``; ``head_phase``: steps per generator-head phase
    (``None`` unless ``head_schedule="phases"`` with several heads)."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    warmup_steps: int
    head_phase: int | None


def build_optimization(model: SOP, cfg: TrainConfig, total_steps: int) -> Optimization:
    """AdamW over ``model.trainable_parameters()`` (fused when all are on a CUDA device:
    :func:`sopfast.devices.adamw`) and its schedule for a run of ``total_steps`` steps (``cfg`` resolved:
    its ``lr`` and ``warmup_ratio`` filled in from the recipe)."""
    heads = model.generator.num_heads
    phases = cfg.head_schedule == "phases" and heads > 1
    head_phase = max(1, total_steps // heads) if phases else None
    lr, warmup_ratio = cfg.lr, cfg.warmup_ratio
    if lr is None or warmup_ratio is None:
        raise ValueError(
            f"the training config must be resolved (TrainConfig.resolved), got lr={lr}, warmup_ratio={warmup_ratio}"
        )
    period = head_phase or total_steps
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(warmup_ratio * period)
    params = model.trainable_parameters()
    if not params:
        raise ValueError("the model has no trainable parameters")
    optimizer = adamw(params, lr=lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg.schedule, warmup, period, head_phase))
    return Optimization(optimizer, scheduler, warmup, head_phase)
