"""RISE (Petsiuk et al., 2018) on sopfast's masked forward: random masks, the backbone's class
probability on each masked input, and the mask-weighted average as each feature's saliency."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..adapters import BackboneAdapter
from ..checks import check_class_ids, check_int, check_tau
from .forward import MASKED_TOKENS_PER_CALL, InputsLike, adapter_of, explainer_mode, feature_inputs, run_mask_sets


def rise_masks(
    batch: int, grid: tuple[int, int] | int, num_masks: int, keep: float, cells: int, generator: torch.Generator
) -> torch.Tensor:
    """``[batch, num_masks, d]`` bool RISE masks over a feature ``grid`` ``(h, w)`` (or a sequence of
    ``d``): ``cells`` coarse cells per side (at most one per feature), each kept with probability
    ``keep``, upsampled bilinearly to the grid plus one cell, shifted at random by less than a cell,
    cropped, and kept where above 0.5 (a feature is either kept or removed: binary, unlike the
    paper's soft masks)."""
    h, w = grid if isinstance(grid, tuple) else (grid, 1)
    rows, cols = min(cells, h), min(cells, w)
    n = batch * num_masks
    coarse = (torch.rand(n, 1, rows, cols, generator=generator) < keep).float()
    step_h, step_w = -(-h // rows), -(-w // cols)
    smooth = F.interpolate(coarse, size=((rows + 1) * step_h, (cols + 1) * step_w), mode="bilinear")
    ys = torch.randint(0, step_h, (n, 1), generator=generator) + torch.arange(h)
    xs = torch.randint(0, step_w, (n, 1), generator=generator) + torch.arange(w)
    crops = smooth[torch.arange(n)[:, None, None], 0, ys[:, :, None], xs[:, None, :]]
    return (crops > 0.5).reshape(batch, num_masks, h * w)


def rise(
    backbone: nn.Module | BackboneAdapter,
    inputs: InputsLike,
    target: torch.Tensor,
    *,
    num_masks: int = 1000,
    keep: float = 0.5,
    cells: int = 7,
    mode: str | None = None,
    seed: int = 0,
    tokens_per_call: int = MASKED_TOKENS_PER_CALL,
) -> torch.Tensor:
    """RISE saliency ``[B, d]`` of class ``target [B]`` over the adapter's features.

    ``num_masks`` random masks per example (:func:`rise_masks`: ``cells`` coarse cells per side kept
    with probability ``keep``, smoothed and shifted as in the paper, at feature resolution), each run
    through :func:`~sopfast.masking.masked_forward` in ``mode`` (``None``: the backbone's faithful mode,
    ``exact`` for a ViT, ``drop`` for BERT); saliency ``S_j = Σ_i p_t(x ⊙ M_i)
    M_ij / (num_masks · keep)``.  Masks that keep nothing run as the input with every feature removed.
    """
    adapter = adapter_of(backbone)
    batch = feature_inputs(adapter, inputs)
    mode = explainer_mode(adapter, mode, batch)
    check_int("num_masks", num_masks, 1)
    check_int("cells", cells, 1)
    check_int("seed", seed, 0)
    check_int("tokens_per_call", tokens_per_call, 1)
    check_tau(keep, "keep")
    b, d = batch.batch_size, adapter.num_features(batch)
    if not isinstance(target, torch.Tensor) or target.shape != (b,):
        raise ValueError(f"target must be a [B] = [{b}] tensor of class ids, got {getattr(target, 'shape', target)!r}")
    if adapter.num_classes is not None:
        check_class_ids("target", target, adapter.num_classes)
    grid = adapter.feature_grid(batch) or d
    generator = torch.Generator().manual_seed(seed)
    masks = rise_masks(b, grid, num_masks, keep, cells, generator).to(batch.device)
    masks &= adapter.candidate_mask(batch).unsqueeze(1)
    logits = run_mask_sets(adapter, batch, masks, mode, tokens_per_call, allow_empty=True).logits
    probs = logits.float().softmax(-1).gather(2, target.view(b, 1, 1).expand(b, num_masks, 1).to(logits.device))
    return (probs * masks.float()).sum(1) / (num_masks * keep)
