"""Run a frozen backbone on many masked copies of its inputs — the engine under SOP's group passes,
and under every perturbation explainer (Occlusion, LIME, KernelSHAP, Shapley sampling, RISE).

A mask keeps some of the adapter's features (ViT patches, BERT tokens, CNN grid cells).  ``exact``
runs the full input with the other features removed the way SOP removes them (ViT: the blank-patch
embedding plus position; BERT: attention-masked; CNN: zero pixels).  ``drop`` (ViT, BERT) runs only
the kept tokens (plus [CLS]; BERT also the second segment, at their original positions): exact for
BERT, an approximation for a ViT (the function it computes on fewer tokens differs; README, "Masked
inference", measures it).  The explainers default to the faithful mode (:func:`explainer_mode`):
``exact`` for a ViT, ``drop`` for BERT; a ViT's ``drop`` is one word away and warns, and
:func:`sopfast.masking.agreement` measures how far its explanations move on your data.  Masks of a
ViT in ``drop`` mode are bucketed by how many features they keep, so each call runs equal-length
sequences without padding.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..adapters import BackboneAdapter
from ..adapters.base import InputsLike, check_mode, feature_inputs
from ..adapters.registry import adapter_of, refuted_drop_claim
from ..checks import check_bool, check_int
from ..types import FeatureInputs, Groups

#: Tokens per backbone call: inference keeps no activations, so calls are larger than SOP's training
#: chunks (4,096 tokens); on 2 CPU cores 16,384 ran a ViT-B layer 1.1–1.25× faster than 4,096.
MASKED_TOKENS_PER_CALL = 16384
#: ``drop`` masks of different sizes run in this many size bins (a call pads to its longest mask).
SIZE_BINS = 16


@dataclass
class MaskedOutputs:
    """The backbone on masked inputs: ``logits [..., C]`` and ``embeddings [..., H]`` (the final
    [CLS] / pooled vector its classifier reads, the key SOP's selector reads)."""

    logits: torch.Tensor
    embeddings: torch.Tensor


def explainer_mode(adapter: BackboneAdapter, mode: str | None, inputs: FeatureInputs | None = None) -> str:
    """``mode`` checked for ``adapter``; ``None`` is the adapter's ``faithful_mode`` (``exact`` for a ViT,
    ``drop`` for BERT, where it computes the same logits).  An adapter of your own that claims ``drop``
    computes the backbone's function has the claim measured on ``inputs`` the first time (once per class;
    a claim that does not hold warns, and the faithful mode is ``exact``).  A mode that does not compute the
    backbone's own function (a ViT's ``drop``) warns once per place it is chosen from."""
    if mode is None:
        refuted = None if inputs is None else refuted_drop_claim(adapter, inputs)
        if refuted is not None:
            warnings.warn(
                f"{type(adapter).__name__}: {refuted.detail}; sopfast.adapters.check(...) says more",
                UnfaithfulModeWarning,
                stacklevel=3,
            )
        return adapter.faithful_mode
    check_mode(adapter, mode)
    if mode not in adapter.trusted_exact_modes:
        warnings.warn(
            f"mode={mode!r} on {type(adapter).__name__} runs a different function than the backbone (only the kept "
            "tokens attend to each other), so its explanations can differ from the backbone's; measure it on your "
            "data with sopfast.masking.agreement(...), or leave mode unset for the faithful mode "
            f"({adapter.faithful_mode!r})",
            UnfaithfulModeWarning,
            stacklevel=3,
        )
    return mode


class UnfaithfulModeWarning(UserWarning):
    """An explainer was asked to run in a mode that changes the function the backbone computes."""


def check_masks(masks: Any, batch: int, features: int, name: str = "masks") -> torch.Tensor:
    """``masks`` as a bool ``[B, M, d]`` tensor (ValueError/TypeError naming ``name`` otherwise)."""
    if not isinstance(masks, torch.Tensor):
        raise TypeError(f"{name} must be a bool tensor [B, M, d], got {type(masks).__name__}")
    if masks.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = keep the feature), got dtype {masks.dtype}")
    if masks.dim() != 3 or masks.shape[0] != batch or masks.shape[2] != features:
        raise ValueError(
            f"{name} must have shape [B, M, d] = [{batch}, M, {features}] (d: the adapter's features), "
            f"got {list(masks.shape)}"
        )
    return masks


def masked_forward(
    backbone: nn.Module | BackboneAdapter,
    inputs: InputsLike,
    masks: torch.Tensor,
    *,
    mode: str | None = None,
    tokens_per_call: int = MASKED_TOKENS_PER_CALL,
    allow_empty: bool = False,
    return_embeddings: bool = False,
) -> torch.Tensor | MaskedOutputs:
    """The frozen ``backbone`` on every mask of ``masks [B, M, d]`` → logits ``[B, M, C]``.

    Args:
        backbone: a model sopfast has an adapter for (HF / timm / torchvision ViT, BERT, CNN with
            ``feature_layer``...), an :class:`sopfast.SOP` (its adapter) or a ``BackboneAdapter``.
        inputs: images ``[B, C, H, W]`` or a mapping of ``input_ids`` / ``attention_mask`` /
            ``token_type_ids`` ``[B, T]``, prepared as the backbone's adapter prepares them.
        masks: bool ``[B, M, d]``, True where mask ``j`` of example ``b`` keeps a feature; features
            that are not part of an input (text padding) are never kept.
        mode: ``"exact"`` or ``"drop"`` (only the kept tokens run; ViT and BERT; module docstring);
            ``None``: the backbone's faithful mode (:func:`explainer_mode`: ``exact`` for a ViT, ``drop``
            for BERT).
        tokens_per_call: about this many tokens per backbone call (the chunking budget).
        allow_empty: run masks that keep nothing, on the ``exact`` path (the input with every
            feature removed: Captum's all-ablated baseline); else they are a ValueError.
        return_embeddings: also return the final [CLS] / pooled embeddings ``[B, M, H]``.
    """
    adapter = adapter_of(backbone)
    check_int("tokens_per_call", tokens_per_call, 1)
    check_bool("allow_empty", allow_empty)
    check_bool("return_embeddings", return_embeddings)
    batch = feature_inputs(adapter, inputs)
    mode = explainer_mode(adapter, mode, batch)
    masks = check_masks(masks, batch.batch_size, adapter.num_features(batch))
    out = run_mask_sets(adapter, batch, masks, mode, tokens_per_call, allow_empty)
    return out if return_embeddings else out.logits


def run_mask_sets(
    adapter: BackboneAdapter,
    inputs: FeatureInputs,
    masks: torch.Tensor,
    mode: str,
    tokens_per_call: int = MASKED_TOKENS_PER_CALL,
    allow_empty: bool = False,
) -> MaskedOutputs:
    """:func:`masked_forward` on checked arguments: ``masks [B, M, d]`` (limited to the candidates) →
    logits ``[B, M, C]`` and embeddings ``[B, M, H]``."""
    b, m, d = masks.shape
    if b * m == 0:  # no example or no mask: empty results, the backbone's widths read off one example
        logits, embeddings = _widths(adapter, inputs)
        return MaskedOutputs(logits.new_empty(b, m, logits.shape[-1]), embeddings.new_empty(b, m, embeddings.shape[-1]))
    masks = masks & adapter.candidate_mask(inputs).unsqueeze(1)
    example = torch.arange(b, device=masks.device).repeat_interleave(m)
    out = run_masked(adapter, inputs, example, masks.reshape(b * m, d), mode, tokens_per_call, allow_empty)
    return MaskedOutputs(out.logits.view(b, m, -1), out.embeddings.view(b, m, -1))


def _widths(adapter: BackboneAdapter, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[1, C]`` and embeddings ``[1, H]`` of the first example (``[1, C]`` / ``[1, H]`` zeros from
    the classifier's shape for an empty batch)."""
    if inputs.batch_size:
        with torch.no_grad():
            return adapter.full_forward(inputs.rows(slice(0, 1)))
    c = adapter.num_classes
    if c is None:
        raise ValueError("inputs holds no example and the backbone has no classifier that says how many classes")
    device = inputs.device
    return torch.zeros(1, c, device=device), torch.zeros(1, adapter.key_dim, device=device)


def run_masked(
    adapter: BackboneAdapter,
    inputs: FeatureInputs,
    example: torch.Tensor,
    masks: torch.Tensor,
    mode: str,
    tokens_per_call: int = MASKED_TOKENS_PER_CALL,
    allow_empty: bool = False,
) -> MaskedOutputs:
    """The backbone on pairs: example ``example[n]`` of ``inputs`` with ``masks[n] [d]`` kept →
    logits ``[N, C]`` and embeddings ``[N, H]``.  Pairs run in buckets — one per kept count where
    ``mode`` needs equal sizes, else (``drop``) one per bin of :data:`SIZE_BINS` similar sizes; empty
    masks on the ``exact`` path — each packed as ``[B', M', d]`` groups (each example's rows, padded
    with its first row) for the adapter."""
    sizes = masks.sum(dim=-1)
    empty = sizes == 0
    if bool(empty.any()) and not allow_empty:
        n = int(empty.nonzero()[0, 0])
        raise ValueError(
            f"mask {n} (example {int(example[n])}) keeps no feature; pass allow_empty=True to run such masks "
            "as the input with every feature removed"
        )
    buckets: list[tuple[torch.Tensor, str]] = []
    if bool(empty.any()):
        buckets.append((empty, "exact"))
    if mode in adapter.equal_size_modes:
        buckets += [(sizes == size, mode) for size in torch.unique(sizes[~empty]).tolist()]
    elif mode == "drop":  # padded to the longest mask of a call: bins of similar sizes waste little
        width = -(-masks.shape[-1] // SIZE_BINS)
        bins = (sizes - 1).clamp_min(0) // width
        buckets += [((bins == b) & ~empty, mode) for b in torch.unique(bins[~empty]).tolist()]
    elif not bool(empty.all()):
        buckets.append((~empty, mode))
    logits = embeddings = None
    with torch.no_grad():
        for selected, bucket_mode in buckets:
            rows = selected.nonzero().squeeze(1)
            preds = _run_packed(adapter, inputs, example[rows], masks[rows], bucket_mode, tokens_per_call)
            if logits is None or embeddings is None:
                n = masks.shape[0]
                logits = preds.logits.new_empty(n, preds.logits.shape[-1])
                embeddings = preds.embeddings.new_empty(n, preds.embeddings.shape[-1])
            logits[rows], embeddings[rows] = preds.logits, preds.embeddings
    if logits is None or embeddings is None:  # no masks at all
        out = _widths(adapter, inputs)
        return MaskedOutputs(out[0].new_empty(0, out[0].shape[-1]), out[1].new_empty(0, out[1].shape[-1]))
    return MaskedOutputs(logits, embeddings)


def _run_packed(
    adapter: BackboneAdapter,
    inputs: FeatureInputs,
    example: torch.Tensor,
    masks: torch.Tensor,
    mode: str,
    tokens_per_call: int,
) -> MaskedOutputs:
    """Pairs of one bucket, packed as groups ``[B', M', d]`` of the examples they use."""
    order = torch.argsort(example, stable=True)
    example, masks = example[order], masks[order]
    used, counts = torch.unique_consecutive(example, return_counts=True)
    start = torch.cumsum(counts, 0) - counts
    row = torch.arange(len(used), device=masks.device).repeat_interleave(counts)
    col = torch.arange(len(example), device=masks.device) - start.repeat_interleave(counts)
    packed = masks[start].unsqueeze(1).repeat(1, int(counts.max()), 1)
    packed[row, col] = masks
    sub = inputs.rows(used)
    groups = Groups.from_masks(packed)
    preds = adapter.run_groups_sized(sub, groups, mode, lambda tokens: max(1, tokens_per_call // max(1, tokens)))
    unsort = torch.empty_like(order)
    unsort[order] = torch.arange(len(order), device=order.device)
    return MaskedOutputs(preds.logits[row, col][unsort], preds.keys[row, col][unsort])
