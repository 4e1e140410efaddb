"""The group selector (docs/method.md, step 9): sparse cross-attention from class queries to group keys."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import group_select


class GroupSelector(nn.Module):
    """``c [B, Cls, m] = sparsemax_i(β · (W_Q' C_c) · (W_K' z_i))``.

    ``class_queries [Cls, H]`` starts as a trainable copy of the backbone classifier's weight;
    ``query_proj`` and ``key_proj`` (``[H, H]``, no bias) start as the identity.
    """

    def __init__(self, class_weight: torch.Tensor, scale: float = 1.0):
        super().__init__()
        hidden = class_weight.shape[1]
        self.scale = scale
        self.class_queries = nn.Parameter(class_weight.detach().clone().float())
        self.query_proj = nn.Linear(hidden, hidden, bias=False)
        self.key_proj = nn.Linear(hidden, hidden, bias=False)
        with torch.no_grad():
            self.query_proj.weight.copy_(torch.eye(hidden))
            self.key_proj.weight.copy_(torch.eye(hidden))

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, Cls, m]`` (fp32) from group keys ``[B, m, H]``."""
        return group_select(self.class_queries, keys, self.query_proj.weight, self.key_proj.weight, self.scale)
