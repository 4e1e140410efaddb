"""The result of one SOP forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .losses import classification_loss, scaled_mse_loss


@dataclass
class SOPOutput:
    """Everything a prediction is made of.

    Shapes: ``B`` examples, ``m`` groups, ``C`` classes/outputs, ``d`` features.

    * ``logits [B, C]`` – ``ŷ_c = Σ_i c_{c,i} λ_i y_{i,c}``
    * ``group_logits [B, m, C]`` – the frozen backbone's logits ``y_i`` on each group
    * ``group_scores [B, C, m]`` – the selector's sparse weights ``c`` (each row sums to 1)
    * ``lam [B, m]`` – the gradient-passing scales ``λ_i ∈ [−1, 1]``
    * ``group_masks [B, m, d]`` – the groups as bool masks at feature resolution
    * ``group_indices [B, m, k]`` – the same groups as ascending feature positions (``-1`` padding)
    * ``attention [B, m, d]`` – the generator's softmax rows (what insertion/deletion order by)
    * ``task`` – ``"classification"`` or ``"regression"``
    """

    logits: torch.Tensor
    group_logits: torch.Tensor
    group_scores: torch.Tensor
    lam: torch.Tensor
    group_masks: torch.Tensor
    group_indices: torch.Tensor
    attention: torch.Tensor
    task: str = "classification"

    @property
    def attributions(self) -> torch.Tensor:
        """``α [B, C, m] = c · λ · y``; ``α.sum(-1) == logits`` exactly (fidelity 0)."""
        return self.group_scores * self.lam.unsqueeze(1) * self.group_logits.transpose(1, 2)

    @property
    def active_groups(self) -> torch.Tensor:
        """``[B, C]`` number of groups with a non-zero score, per class."""
        return (self.group_scores > 0).sum(dim=-1)

    def loss(self, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy (classification) or the paper's scaled MSE (regression)."""
        if self.task == "regression":
            return scaled_mse_loss(self.group_logits, self.group_scores, self.lam, labels)
        return classification_loss(self.logits, labels)
