"""The group generator (SPEC §2.1–2.7): attention over features, binarised to top-τ groups."""

from __future__ import annotations

import torch
from torch import nn

from .ops import top_tau
from .types import Groups


def candidate_positions(valid: torch.Tensor) -> torch.Tensor:
    """``[B, d]``: the positions of each row's valid features first, in order."""
    d = valid.shape[1]
    pos = torch.arange(d, device=valid.device).expand_as(valid)
    return torch.sort(torch.where(valid, pos, pos + d), dim=1).values.remainder(d)


def query_rows(
    counts: torch.Tensor, num_groups: int, num_heads: int, head: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which attention rows become groups (SPEC §2.5).

    ``counts [B]`` candidate features per example.  Training (``head`` given): rows
    ``floor(j·d/m)`` of that head.  Evaluation (``head=None``): the heads' rows stacked,
    ``H·d`` candidates, rows ``floor(j·H·d/m)``.  Returns ``(head [B, m], candidate [B, m])``.
    """
    j = torch.arange(num_groups, device=counts.device).view(1, -1)
    d = counts.view(-1, 1).long()
    if head is not None:
        return torch.full_like(j * d, head), (j * d) // num_groups
    rows = (j * num_heads * d) // num_groups
    return rows // d, rows % d


class GroupGenerator(nn.Module):
    """Multi-head attention logits for the ``m`` kept query rows, then :func:`sopfast.ops.top_tau`.

    ``weight [3E, E]`` (no bias, Xavier-uniform over the whole matrix): keys use rows
    ``E:2E``, queries rows ``2E:3E``; logits ``s = scale · Q Kᵀ`` per head (no 1/√E).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int = 1,
        scale: float = 1.0,
        blur_kernel_size: int = 0,
        blur_sigma: float = 1.0,
    ):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"num_heads must be ≥ 1 and divide the embedding size {embed_dim}, got {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.scale = scale
        self.blur_kernel_size = blur_kernel_size
        self.blur_sigma = blur_sigma
        self.weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        nn.init.xavier_uniform_(self.weight)

    def logits(
        self, emb: torch.Tensor, valid: torch.Tensor, num_groups: int, head: int | None
    ) -> torch.Tensor:
        """Attention logits ``[B, m, d]`` of the kept query rows (fp32) from ``emb [B, d, E]``."""
        b, _, e = emb.shape
        h = self.num_heads
        emb = emb.float()
        w = self.weight.float()
        head_idx, cand = query_rows(valid.sum(dim=1), num_groups, h, head)
        qpos = candidate_positions(valid).gather(1, cand)
        q_emb = emb.gather(1, qpos.unsqueeze(-1).expand(b, num_groups, e))
        q = (q_emb @ w[2 * e:].t()).view(b, num_groups, h, e // h)
        one_head = torch.nn.functional.one_hot(head_idx, h).to(q.dtype).unsqueeze(-1)
        keys = emb @ w[e:2 * e].t()
        return self.scale * ((q * one_head).reshape(b, num_groups, e) @ keys.transpose(1, 2))

    def forward(
        self,
        emb: torch.Tensor,
        valid: torch.Tensor | None,
        num_groups: int,
        tau: float,
        head: int | None = None,
        deletion: bool = False,
        grid: tuple[int, int] | None = None,
    ) -> Groups:
        """Groups from feature embeddings ``emb [B, d, E]`` (``valid [B, d]`` bool or ``None``)."""
        b, d, _ = emb.shape
        if valid is None:
            valid = torch.ones(b, d, dtype=torch.bool, device=emb.device)
        with torch.autocast(device_type=emb.device.type, enabled=False):
            s = self.logits(emb, valid, num_groups, head)
        rows_valid = valid.unsqueeze(1).expand(b, num_groups, d).reshape(b * num_groups, d)
        result = top_tau(
            s.reshape(b * num_groups, d),
            tau,
            valid=None if bool(valid.all()) else rows_valid,
            largest=not deletion,
            blur_kernel_size=self.blur_kernel_size,
            blur_sigma=self.blur_sigma,
            grid=grid,
        )
        return Groups(
            mask=result.mask.view(b, num_groups, d),
            indices=result.indices.view(b, num_groups, -1),
            lam=result.lam.view(b, num_groups),
            attention=result.attention.view(b, num_groups, d),
        )
