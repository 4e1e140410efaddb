"""A plain, faithful implementation of the authors' SOP algorithm — the oracle and the baseline.

It computes what the authors' public code computes, the way it computes it: the full
projection forward with ``output_hidden_states``; attention for **all** ``d`` candidate
query rows of every head (``H`` full-width weights); torchvision's ``gaussian_blur``; the
authors' top-k (``k = int(d·τ)``; the fp32 softmax values sorted ascending by a stable sort,
then flipped, so equal values go to the higher index), or with ``ties="logits"`` a stable
descending sort of the blurred logits; **full-resolution** pixel masks; ``m`` masked full forwards of the backbone in
chunks of 16 with autograd left on; a sort-based sparsemax.  It is deliberately not
optimised.  :func:`reference_forward` reads the parameters of a :class:`sopfast.SOP`, so both
can be compared on the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..adapters.conformance import masked_inputs
from ..ops import num_kept
from ..ops.counts import canonical_for_sort
from ..ops.sparsemax import sparsemax_reference
from ..types import FeatureInputs
from .output import SOPOutput
from .recipes import RECIPES
from .sop import SOP

CHUNK = 16


def _embedding(model: SOP, inputs: FeatureInputs) -> torch.Tensor:
    """``hidden_states[-2]`` of the projection on the unmasked input, feature tokens only."""
    return model.adapter.reference_embed(model.projection, inputs)


def _blur(logits: torch.Tensor, model: SOP, grid: tuple[int, int] | None) -> torch.Tensor:
    """Blur every attention row ``logits [..., d]`` (torchvision for grids, conv1d for text)."""
    ks, sigma = model.generator.blur_kernel_size, model.generator.blur_sigma
    if ks <= 1:
        return logits
    shape = logits.shape
    if grid is not None:
        from torchvision.transforms.functional import gaussian_blur

        rows = logits.reshape(-1, 1, *grid)
        return gaussian_blur(rows, [ks, ks], [sigma, sigma]).reshape(shape)
    half = (ks - 1) * 0.5
    x = torch.linspace(-half, half, ks, dtype=logits.dtype, device=logits.device)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    kernel = (kernel / kernel.sum()).view(1, 1, ks)
    rows = F.pad(logits.reshape(-1, 1, shape[-1]), (ks // 2, ks // 2), mode="reflect")
    return F.conv1d(rows, kernel).reshape(shape)


def _all_logits(model: SOP, emb: torch.Tensor, valid: torch.Tensor, grid) -> torch.Tensor:
    """Blurred attention logits of every query position over the keys, per head: ``[B, H, d, d]``
    (invalid keys at ``-inf``)."""
    b, d, e = emb.shape
    heads = []
    for w in model.generator.heads:
        keys = emb @ w[e : 2 * e].t()
        queries = emb @ w[2 * e :].t()
        heads.append(model.generator.scale * queries @ keys.transpose(-1, -2))
    logits = _blur(torch.stack(heads, dim=1), model, grid)
    return logits.masked_fill(~valid.view(b, 1, 1, d), float("-inf"))


def _select_rows(model: SOP, attn: torch.Tensor, valid: torch.Tensor, m: int) -> torch.Tensor:
    """The ``m`` kept rows ``[B, m, d]`` of ``attn [B, H, d, d]`` per example (docs/method.md, step 5)."""
    rows = []
    for b in range(attn.shape[0]):
        cand = valid[b].nonzero().flatten()
        stacked = attn[b][:, cand]
        if model.training:
            stacked = stacked[model.epoch % model.generator.num_heads]
        else:
            stacked = stacked.reshape(-1, attn.shape[-1])
        n = stacked.shape[0]
        rows.append(stacked[[j * n // m for j in range(m)]])
    return torch.stack(rows)


def _authors_order(a: torch.Tensor, deletion: bool) -> torch.Tensor:
    """The authors' ranking of attention rows ``a [m, d]``: ascending sort, flipped unless deleting (NaN
    ranked alike on every device: :func:`sopfast.ops.counts.canonical_for_sort`)."""
    order = torch.sort(canonical_for_sort(a), dim=-1, stable=True).indices
    return order if deletion else order.flip(-1)


def _logits_order(s: torch.Tensor, deletion: bool) -> torch.Tensor:
    """The ranking of blurred logit rows ``s [m, d]`` for ``ties="logits"``: a stable sort, descending
    unless deleting."""
    return torch.sort(canonical_for_sort(s), dim=-1, descending=not deletion, stable=True).indices


def _binarise(model: SOP, a: torch.Tensor, s: torch.Tensor, valid: torch.Tensor, tau: float) -> torch.Tensor:
    """Top-k with ``k = int(d·τ)`` (at least 1) per example: the authors' ranking of the attention
    ``a`` (``ties="authors"``) or a stable sort of the blurred logits ``s`` (``ties="logits"``)."""
    masks = torch.zeros_like(a, dtype=torch.bool)
    for b in range(a.shape[0]):
        d = int(valid[b].sum())
        k = max(1, int(d * tau))
        if model.generator.ties == "authors":
            order = _authors_order(a[b].masked_fill(~valid[b], 2.0 if model.deletion else -1.0), model.deletion)
        else:
            scores = s[b].masked_fill(~valid[b], float("inf") if model.deletion else float("-inf"))
            order = _logits_order(scores, model.deletion)
        masks[b].scatter_(-1, order[:, :k], True)
    return masks


# options that change the forward pass beyond the authors' algorithm (the others only add training losses)
BEYOND_THE_PAPER = (
    "normalize_logits",
    "center_embeddings",
    "queries",
    "key_score",
    "unit_lambda",
    "demote_blank",
    "keep_special_tokens",
)


def check_paper_options(model: SOP) -> None:
    """ValueError naming every option of ``model`` whose value differs from the authors' algorithm."""
    paper = RECIPES["paper"].model
    differ = [
        f"{name}={model.config.get(name)!r}" for name in BEYOND_THE_PAPER if model.config.get(name) != paper[name]
    ]
    if differ:
        raise ValueError(
            f"reference_forward runs the authors' algorithm, but the model uses {', '.join(differ)} "
            "(allowed: the values of recipe='paper'); build it with sopfast.SOP(..., recipe='paper')"
        )


def _rows(inputs: FeatureInputs, sl: slice) -> FeatureInputs:
    return FeatureInputs(**{k: (None if v is None else v[sl]) for k, v in vars(inputs).items()})


def reference_forward(
    model: SOP,
    x: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    tau: float | None = None,
) -> SOPOutput:
    """The authors' algorithm on ``model``'s parameters (see the module docstring); ``model`` must use
    none of the generator options beyond the paper (build it with ``recipe="paper"``)."""
    check_paper_options(model)
    tau = model.tau if tau is None else tau
    adapter = model.adapter
    inputs = adapter.prepare(x, attention_mask, token_type_ids)
    b, d, m = inputs.batch_size, adapter.num_features(inputs), model.num_groups
    valid = adapter.candidates(inputs)
    if valid is None:
        valid = torch.ones(b, d, dtype=torch.bool, device=inputs.device)
    grid = adapter.feature_grid(inputs)
    logits = _all_logits(model, _embedding(model, inputs).float(), valid, grid)
    s = _select_rows(model, logits, valid, m)
    a = torch.softmax(s, dim=-1)
    masks = _binarise(model, a, s, valid, tau)
    lam = (a * masks).sum(-1) - (a * ~masks).sum(-1)
    masked = masked_inputs(adapter, inputs, masks)
    outputs = [adapter.full_forward(_rows(masked, slice(s, s + CHUNK))) for s in range(0, b * m, CHUNK)]
    y = torch.cat([o[0] for o in outputs]).view(b, m, -1).float()
    z = torch.cat([o[1] for o in outputs]).view(b, m, -1).float()
    sel = model.selector
    scores = sel.scale * (sel.class_queries @ sel.query_proj.weight.t()) @ (z @ sel.key_proj.weight.t()).transpose(1, 2)
    c = sparsemax_reference(scores)
    logits = (c * lam.unsqueeze(1) * y.transpose(1, 2)).sum(-1)
    positions = torch.arange(d, device=inputs.device).expand(b, m, d)
    k_max = num_kept(tau, d)  # the widest group, as the fast path pads to (no host read)
    indices = torch.sort(torch.where(masks, positions, positions + d), dim=-1).values[..., :k_max]
    indices = torch.where(indices < d, indices, torch.full_like(indices, -1))
    return SOPOutput(logits, y, c, lam, masks, indices, a, model.task)


__all__ = ["BEYOND_THE_PAPER", "CHUNK", "check_paper_options", "reference_forward"]
