"""SOP losses (paper, appendix "Scaling the Loss")."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the aggregated logits ``ŷ = Σ_i c_i λ_i y_i`` (``[B, C]``, labels ``[B]``)."""
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels must have shape [B]=[{logits.shape[0]}], got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise TypeError(f"labels must be integer class ids, got {labels.dtype}")
    if labels.numel() == 0:
        return logits.float().sum() * 0.0  # an empty batch contributes nothing (not NaN)
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= logits.shape[1]:
        raise ValueError(f"labels must lie in [0, {logits.shape[1] - 1}] (the model's classes), got [{low}, {high}]")
    return F.cross_entropy(logits.float(), labels.long())


def scaled_mse_loss(
    group_logits: torch.Tensor, group_scores: torch.Tensor, lam: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The paper's scaled MSE for regression: ``mean_{b,c} (Σ_i c_{c,i} (y_{i,c} − y*_c)(−λ_i))²``.

    ``group_logits [B, m, C]``, ``group_scores [B, C, m]``, ``lam [B, m]``, ``targets [B, C]`` (or ``[B]``).
    """
    b, _, c = group_logits.shape
    targets = targets.float().reshape(b, -1)
    if targets.shape[1] != c:
        raise ValueError(f"targets must have shape [B, {c}] (or [B] for one output), got {tuple(targets.shape)}")
    if b == 0:
        return group_logits.float().sum() * 0.0
    residual = group_logits.float() - targets.unsqueeze(1)
    weighted = group_scores.float().transpose(1, 2) * residual * (-lam.float()).unsqueeze(-1)
    return weighted.sum(dim=1).pow(2).mean()
