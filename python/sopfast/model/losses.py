"""SOP losses (paper, appendix "Scaling the Loss")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..checks import check_tensor, check_values
from .agreement import agreement_scores
from .generator import standardize_rows


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the aggregated logits ``ŷ = Σ_i c_i λ_i y_i`` (``[B, C]``, labels ``[B]``)."""
    check_tensor("labels", labels)
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels must have shape [B]=[{logits.shape[0]}], got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise TypeError(f"labels must be integer class ids, got {labels.dtype}")
    if labels.numel() == 0:
        return logits.float().sum() * 0.0  # an empty batch contributes nothing (not NaN)
    low, high = torch.aminmax(labels)
    check_values(
        (low >= 0) & (high < logits.shape[1]),
        f"labels must lie in [0, {logits.shape[1] - 1}] (the model's classes)",
        lambda: f", got [{int(low)}, {int(high)}]",
    )
    return F.cross_entropy(logits.float(), labels.long())


def scaled_mse_loss(
    group_logits: torch.Tensor, group_scores: torch.Tensor, lam: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The paper's scaled MSE for regression: ``mean_{b,c} (Σ_i c_{c,i} (y_{i,c} − y*_c)(−λ_i))²``.

    ``group_logits [B, m, C]``, ``group_scores [B, C, m]``, ``lam [B, m]``, ``targets [B, C]`` (or ``[B]``).
    """
    b, _, c = group_logits.shape
    check_tensor("targets", targets)
    if targets.dim() == 1 and c == 1:
        targets = targets.unsqueeze(1)
    if tuple(targets.shape) != (b, c):
        one = f" (or [B] = [{b}] for one output)" if c == 1 else ""
        raise ValueError(f"targets must have shape [B, {c}] = [{b}, {c}]{one}, got {tuple(targets.shape)}")
    if targets.dtype == torch.bool or targets.is_complex():
        raise TypeError(f"targets must be real numbers, got dtype {targets.dtype}")
    targets = targets.float()
    if b == 0:
        return group_logits.float().sum() * 0.0
    finite = torch.isfinite(targets)
    check_values(
        finite.all(),
        "targets (the regression labels) must be finite numbers, not NaN or infinity",
        lambda: f", got {int((~finite).sum())} non-finite values: {targets[~finite][:5].tolist()}",
    )
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
    if m < 2 or b == 0:  # no pairs (an empty batch has none either)
        return attention.new_zeros(())
    a = attention.float()
    if valid is not None:
        a = a * valid.unsqueeze(1).to(a.dtype)
    a = F.normalize(a, dim=-1)
    gram = a @ a.transpose(1, 2)
    off_diagonal = ~torch.eye(m, dtype=torch.bool, device=a.device)
    return (gram * off_diagonal).sum() / (b * m * (m - 1))


def mean_saliency(model, inputs, levels: Sequence[float], target: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, d]``: :func:`feature_saliency` averaged over the presence ``levels`` (one backbone backward
    each; two levels such as ``(0.2, 0.6)`` are a 2-step Integrated Gradients) towards ``target``
    (:func:`full_prediction` of the inputs; computed once, not once per level, when not given)."""
    target = full_prediction(model, inputs) if target is None else target
    return torch.stack([feature_saliency(model, inputs, z, target) for z in levels]).mean(dim=0)


def full_prediction(model, inputs, reference: torch.Tensor | None = None) -> torch.Tensor:
    """The frozen backbone on the full ``inputs`` (no gradient; ``reference``: its logits ``[B, C]`` when
    already computed, :meth:`sopfast.SOP.reference_logits`): its predicted class ``[B]`` (long), or for a
    regression model (``model.task == "regression"``) its outputs ``[B, C]``."""
    logits = model.reference_logits(inputs) if reference is None else reference
    return logits.float() if getattr(model, "task", "classification") == "regression" else logits.argmax(dim=-1)


def feature_saliency(model, inputs, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, d]``: how much each feature moves the frozen backbone towards its own full-input prediction,
    at a uniform feature presence ``z = level`` (the adapter's ``soft_forward``: pixels scaled by ``z``, or
    token embeddings blended with [PAD]): ``∂f_ŷ/∂z_j``, the gradient of the logit of the predicted class,
    or for regression ``−∂/∂z_j ½‖f(z) − f(1)‖²``, of the outputs' closeness to the full-input outputs.
    One forward and one backward of the backbone; no gradient flows back.  With ``level = τ`` it ranks
    features about as well as Integrated Gradients on the demo backbone (``docs/quality.md``) at the cost
    of gradient × input.  ``target``: :func:`full_prediction` (default: computed, one more forward).
    """
    adapter = model.adapter
    target = full_prediction(model, inputs) if target is None else target
    z = torch.full((inputs.batch_size, adapter.num_features(inputs)), float(level), device=inputs.device)
    z.requires_grad_(True)
    with torch.enable_grad():
        logits = adapter.soft_forward(inputs, z).float()
        if target.is_floating_point():
            objective = -0.5 * (logits - target).pow(2).sum()
        else:
            objective = logits.gather(1, target.view(-1, 1)).sum()
        (grad,) = torch.autograd.grad(objective, z)
    return grad.detach()


def _no_rows(attention: torch.Tensor, saliency: torch.Tensor) -> bool:
    """Checks ``attention [B, m, d]`` against ``saliency [B, d]``; True when there is no row to score."""
    if attention.dim() != 3 or saliency.shape != (attention.shape[0], attention.shape[2]):
        raise ValueError(
            f"attention must be [B, m, d] and saliency [B, d] with the same B and d, got "
            f"{tuple(attention.shape)} and {tuple(saliency.shape)}"
        )
    return attention.shape[0] == 0 or attention.shape[1] == 0


def saliency_alignment(
    attention: torch.Tensor, saliency: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """``−mean_{b,i} Σ_j a_bij · ŝ_bj``: minus the saliency an attention row holds on average.

    ``attention [B, m, d]`` (softmax rows), ``saliency [B, d]`` standardised over each input's
    ``valid [B, d]`` features into ``ŝ`` (mean 0, variance 1).  An opt-in training signal for the
    generator (``SOP(saliency_weight=...)``), not part of the paper.
    """
    if _no_rows(attention, saliency):
        return attention.new_zeros(())
    w = torch.ones_like(saliency) if valid is None else valid.to(saliency.dtype)
    count = w.sum(dim=-1, keepdim=True).clamp_min(1)
    mean = (saliency * w).sum(dim=-1, keepdim=True) / count
    std = (((saliency - mean) * w).pow(2).sum(dim=-1, keepdim=True) / count).sqrt().clamp_min(1e-12)
    score = ((saliency - mean) / std * w).float()
    return -(attention.float() * score.unsqueeze(1)).sum(dim=-1).mean()


def saliency_kl(
    attention: torch.Tensor, saliency: torch.Tensor, valid: torch.Tensor | None = None, gamma: float = 1.0
) -> torch.Tensor:
    """``mean_{b,i} KL(p_b ‖ a_bi)`` with the target ``p_b = softmax(γ · ŝ_b)`` over the ``valid`` features.

    ``attention [B, m, d]`` (softmax rows), ``saliency [B, d]`` standardised over each input's ``valid
    [B, d]`` features into ``ŝ`` (mean 0, variance 1), ``gamma`` the generator's γ.  Unlike
    :func:`saliency_alignment`, which rewards putting all the mass on the most salient feature, it
    teaches the whole ranking, so every top-τ prefix is salient.  An opt-in training signal for the
    generator (``SOP(saliency_loss="kl")``), not part of the paper.
    """
    if _no_rows(attention, saliency):
        return attention.new_zeros(())
    valid = torch.ones_like(saliency, dtype=torch.bool) if valid is None else valid
    score = gamma * standardize_rows(saliency.float().unsqueeze(1), valid)
    target = torch.softmax(score.masked_fill(~valid.unsqueeze(1), float("-inf")), dim=-1)
    log_ratio = target.clamp_min(1e-30).log() - attention.float().clamp_min(1e-30).log()
    return (target * log_ratio).masked_fill(~valid.unsqueeze(1), 0.0).sum(dim=-1).mean()


def sufficiency_loss(group_logits: torch.Tensor, lam: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
    """``−mean_{b,i} A_bi · λ_bi``: each group's advantage ``A_bi = r_bi − mean_j r_bj`` in ``r_bi = log p_bi(ŷ_b)``
    (how well group ``i`` alone makes the frozen backbone predict its full-input class ``ŷ_b``; no gradient)
    weighting its gradient-passing scale ``λ`` (the generator's one gradient path).  Minimising it raises
    ``λ`` (the attention a row keeps on its group) for groups better than the input's others and lowers it
    for worse ones — a signal for every group, also those the selector leaves out, which the paper's loss
    never reaches.  ``group_logits [B, m, C]``, ``lam [B, m]``, ``reference_logits [B, C]``.  An opt-in
    training signal for the generator (``SOP(sufficiency_weight=...)``), not part of the paper."""
    if group_logits.shape[0] == 0 or group_logits.shape[1] < 2:
        return lam.sum() * 0.0
    reward = agreement_scores(group_logits, reference_logits)
    advantage = reward - reward.mean(dim=1, keepdim=True)
    return -(advantage * lam.float()).mean()


def distillation_loss(logits: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
    """``mean_b KL(softmax(reference_b) ‖ softmax(logits_b))``: how far SOP's class distribution ``logits [B, C]``
    is from the frozen backbone's on the whole input ``reference_logits [B, C]`` (no gradient to it)."""
    if logits.shape[0] == 0:
        return logits.float().sum() * 0.0
    target = torch.log_softmax(reference_logits.detach().float(), dim=-1)
    return F.kl_div(torch.log_softmax(logits.float(), dim=-1), target, log_target=True, reduction="batchmean")
