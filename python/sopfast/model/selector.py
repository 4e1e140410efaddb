"""The group selector (docs/method.md, step 9): sparse cross-attention from class queries to group keys,
optionally with an agreement prior (``SOP(agreement_prior=α)``, beyond the paper)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import group_select, sparsemax
from ..ops.group_select import selector_scores


def check_class_weights(class_weights: object, key_dim: int, num_classes: int | None) -> torch.Tensor:
    """``class_weights`` if it is a finite float ``[C, H]`` tensor with ``H = key_dim`` (and ``C = num_classes``
    where the backbone knows its classes)."""
    h, c = key_dim, num_classes
    shape = f"[C, H] = [{c if c is not None else 'C'}, {h}] (C the backbone's classes, H its key width)"
    if not isinstance(class_weights, torch.Tensor):
        raise TypeError(f"class_weights must be a float tensor {shape}, got {type(class_weights).__name__}")
    if not class_weights.is_floating_point():
        raise TypeError(f"class_weights must be a float tensor {shape}, got dtype {class_weights.dtype}")
    rows_ok = c is None or (class_weights.dim() == 2 and class_weights.shape[0] == c)
    if class_weights.dim() != 2 or class_weights.shape[1] != h or not rows_ok:
        raise ValueError(f"class_weights must have shape {shape}, got {tuple(class_weights.shape)}")
    if not bool(torch.isfinite(class_weights).all()):
        raise ValueError("class_weights must be finite (it holds NaN or infinite values)")
    return class_weights


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

    def forward(self, keys: torch.Tensor, prior: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``[B, Cls, m]`` (fp32) from group keys ``[B, m, H]``; ``prior [B, m]`` (the agreement prior,
        :func:`agreement_scores` times its weight) is added to every class's score of a group before the
        sparsemax."""
        weights = (self.class_queries, keys, self.query_proj.weight, self.key_proj.weight, self.scale)
        if prior is None:
            return group_select(*weights)
        return sparsemax(selector_scores(*weights) + prior.unsqueeze(1), dim=-1)
