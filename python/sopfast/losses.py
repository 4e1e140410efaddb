"""SOP losses (paper, appendix "Scaling the Loss")."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the aggregated logits ``ŷ = Σ_i c_i λ_i y_i`` (``[B, C]``, labels ``[B]``)."""
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels must have shape [B]=[{logits.shape[0]}], got {tuple(labels.shape)}")
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
    residual = group_logits.float() - targets.unsqueeze(1)
    weighted = group_scores.float().transpose(1, 2) * residual * (-lam.float()).unsqueeze(-1)
    return weighted.sum(dim=1).pow(2).mean()


def attention_overlap(attention: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cosine similarity between an input's attention rows, over inputs and pairs ``i ≠ j``.

    ``attention [B, m, d]`` (the generator's softmax rows, non-negative), ``valid [B, d]`` the
    candidate features (default all).  0 when the rows attend to disjoint features, 1 when they
    are equal.  An opt-in diversity term for the generator (``SOP(diversity_weight=...)``), not
    part of the paper.
    """
    if attention.dim() != 3:
        raise ValueError(f"attention must have shape [B, m, d], got {tuple(attention.shape)}")
    b, m, _ = attention.shape
    if m < 2:
        return attention.new_zeros(())
    a = attention.float()
    if valid is not None:
        a = a * valid.unsqueeze(1).to(a.dtype)
    a = F.normalize(a, dim=-1)
    gram = a @ a.transpose(1, 2)
    off_diagonal = ~torch.eye(m, dtype=torch.bool, device=a.device)
    return (gram * off_diagonal).sum() / (b * m * (m - 1))
