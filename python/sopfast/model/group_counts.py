"""How many different groups an input has: the one count that training's records, the end-of-training
collapse warning and :func:`sopfast.evaluation.metrics.distinct_groups` share."""

from __future__ import annotations

import torch


def distinct_rows(masks: torch.Tensor, used: torch.Tensor | None = None) -> torch.Tensor:
    """``[N]`` long: the different rows of ``masks [N, m, d]`` (bool) per example, counting only the rows
    ``used [N, m]`` marks (default all); a row equal to an earlier used row is not counted again."""
    n, m, _ = masks.shape
    if used is None:
        used = torch.ones(n, m, dtype=torch.bool, device=masks.device)
    same = (masks.unsqueeze(2) == masks.unsqueeze(1)).all(dim=-1)
    earlier = torch.ones(m, m, dtype=torch.bool, device=masks.device).tril(-1)
    repeated = (same & earlier & used.unsqueeze(1)).any(dim=-1)
    return (used & ~repeated).sum(dim=-1)
