"""Random groups of features: the one sampler behind :func:`sopfast.diagnose` (groups of SOP's size),
:func:`sopfast.adapt_backbone` (groups of random sizes) and the ``Random`` baseline of
:func:`sopfast.evaluate` (its scores, ranked at every τ).  Draws are made on the CPU with the caller's
``torch.Generator``, so a seed gives the same groups on every device."""

from __future__ import annotations

import torch

from ..ops.counts import num_kept_table


def random_group_scores(candidates: torch.Tensor, num_groups: int, generator: torch.Generator) -> torch.Tensor:
    """``[B, m, d]`` float scores on the CPU: uniform in ``[0, 1)`` for each example's candidate features
    (``candidates [B, d]`` bool), ``-1`` for the others; a group is a top set of its row."""
    valid = candidates.cpu()
    b, d = valid.shape
    return torch.rand(b, num_groups, d, generator=generator).masked_fill(~valid.unsqueeze(1), -1.0)


def random_groups(
    candidates: torch.Tensor, keep: float | torch.Tensor, num_groups: int, generator: torch.Generator
) -> torch.Tensor:
    """``[B, m, d]`` bool on the CPU: ``m`` groups per example, each a uniformly random set of its candidate
    features (``candidates [B, d]``): ``keep`` of them — a share τ (``num_kept(τ, c)`` of an example's
    ``c`` candidates, SOP's rule) or counts ``[B]``; the top of :func:`random_group_scores`."""
    valid = candidates.cpu()
    scores = random_group_scores(valid, num_groups, generator)
    if isinstance(keep, torch.Tensor):
        k = keep.cpu().long()
    else:
        k = torch.tensor(num_kept_table(float(keep), valid.shape[1]))[valid.sum(dim=1)]
    rank = scores.argsort(dim=-1, descending=True).argsort(dim=-1)
    return (rank < k.view(-1, 1, 1)) & valid.unsqueeze(1)
