"""Self-attributing baselines on SOP's masked-inference path (paper, appendix "Baselines").

Every baseline here predicts with the *same frozen backbone* and the *same group execution*
as the SOP model it is compared with (``model.adapter.run_groups``, exact or drop):

* **"-F" conversions** (:class:`AttributionBaseline`): the top-τ features of a per-feature
  attribution form ONE group and the backbone predicts on it (FRESH-style).  Attributions
  are computed for the backbone's own full-input prediction.  For regression each output gets
  its own attribution and group (the authors' CosmoGrid set-up).  Built in, no extra
  dependency: gradient × input (:func:`gradient_x_input`) and Grad-CAM on the last feature
  map / token layer (:func:`grad_cam`).  With Captum installed: Integrated Gradients,
  Occlusion, LIME and KernelSHAP (:func:`captum_attribution`), budget-matched to SOP's 20
  forward passes where the method allows; RISE (:func:`rise_attribution`, no dependency).
  Perturbed inputs run on :mod:`sopfast.masking` in the evaluation's mode.
* **FRESH** (:class:`Fresh`): one group from attention — the backbone's last-layer CLS
  attention (Transformers) or the mean of the SOP generator's attention rows.
* **Random groups** (:class:`RandomGroups`): ``m`` random groups of ``k`` features, combined by
  SOP's trained selector — SOP without a learned generator.
* **Patch grid** (:class:`PatchGrid`): fixed square patches of the feature grid (contiguous
  token spans for text) whose logits are averaged, BagNet-style; sparsity keeps the patches
  that contribute most, as the paper does for BagNet.

A baseline is a :class:`~sopfast.evaluation.methods.Method` (:mod:`sopfast.evaluation.methods`);
the attributions are in :mod:`sopfast.evaluation.attributions`.  This module is also the public
``sopfast.baselines`` namespace, so it hands on those two modules' names.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..checks import check_int
from ..masking.random_groups import random_group_scores
from ..types import FeatureInputs
from .attributions import (
    CAPTUM_METHODS,
    FORWARD_BUDGET,
    AttributionFn,
    captum_attribution,
    captum_available,
    cls_attention,
    grad_cam,
    gradient_x_input,
    has_cls_attention,
    rise_attribution,
    soft_forward,
)
from .methods import (
    Method,
    Prediction,
    ScoreBaseline,
    SOPMethod,
    backbone_logits,
    candidate_mask,
    combine_groups,
    run_masks,
    top_tau_masks,
)

if TYPE_CHECKING:
    from ..model.sop import SOP


class AttributionBaseline(ScoreBaseline):
    """ "-F": the top-τ features of ``attribute(model, inputs, target[, mode]) → [B, d]`` form one group.

    The target is the backbone's full-input prediction (classification) or, for regression,
    each output in turn (one group per output, ``combine="per_output"``).
    """

    def __init__(self, name: str, attribute: Callable[..., torch.Tensor]):
        self.name = name
        self.attribute = attribute
        # a function of (model, inputs, target) also works: it gets no mode
        parameters = inspect.signature(attribute).parameters.values()
        variadic = any(p.kind is p.VAR_POSITIONAL for p in parameters)
        self._takes_mode = variadic or len(parameters) >= 4

    def _attribute(self, model: SOP, inputs: FeatureInputs, target: torch.Tensor, mode: str) -> torch.Tensor:
        return (
            self.attribute(model, inputs, target, mode) if self._takes_mode else self.attribute(model, inputs, target)
        )

    def combine_mode(self, model: SOP) -> str:
        return "per_output" if model.task == "regression" else "mean"

    def scores(self, model: SOP, inputs: FeatureInputs, mode: str = "exact") -> torch.Tensor:
        logits = backbone_logits(model, inputs)
        if model.task == "regression":
            rows = [
                self._attribute(model, inputs, torch.full_like(logits[:, 0], c, dtype=torch.long), mode)
                for c in range(logits.shape[1])
            ]
            return torch.stack(rows, dim=1)
        return self._attribute(model, inputs, logits.argmax(dim=-1), mode).unsqueeze(1)


class Fresh(ScoreBaseline):
    """FRESH with a frozen backbone: one group from attention.

    ``source="cls"``: the backbone's last-layer attention from the CLS token to each feature,
    averaged over heads (HF ViT / BERT, timm ViT with a class token); ``"generator"``: the
    mean of the SOP generator's attention rows (any backbone, CNNs included); ``"auto"``: CLS
    where the backbone has one, else the generator.
    """

    SOURCES = ("auto", "cls", "generator")

    def __init__(self, source: str = "auto"):
        if source not in self.SOURCES:
            raise ValueError(f"source must be one of {self.SOURCES}, got {source!r}")
        self.source = source
        self.name = "FRESH"

    def scores(self, model: SOP, inputs: FeatureInputs, mode: str = "exact") -> torch.Tensor:
        source = self.source
        if source == "auto":
            source = "cls" if has_cls_attention(model) else "generator"
        with torch.no_grad():
            if source == "generator":
                return model.make_groups(inputs).attention.mean(dim=1, keepdim=True)
            return cls_attention(model, inputs).unsqueeze(1)


class RandomGroups(ScoreBaseline):
    """``num_groups`` groups of random features (seeded once; :func:`sopfast.masking.random_group_scores`,
    whose top-τ sets are :func:`sopfast.masking.random_groups`), combined by SOP's selector
    (``combine="selector"``) or averaged (``"mean"``)."""

    def __init__(self, num_groups: int | None = None, seed: int = 0, combine: str = "selector"):
        if combine not in ("mean", "selector"):
            raise ValueError(f"combine must be 'mean' or 'selector', got {combine!r}")
        check_int("num_groups", num_groups, 1, optional=True)
        self.name = "Random"
        self.varies_groups = True
        self.num_groups = num_groups
        self.combine = combine
        self.generator = torch.Generator().manual_seed(seed)

    def scores(self, model: SOP, inputs: FeatureInputs, mode: str = "exact") -> torch.Tensor:
        m = self.num_groups or model.num_groups
        return random_group_scores(candidate_mask(model, inputs), m, self.generator).to(inputs.device)


# -- fixed groups ---------------------------------------------------------------------------
class PatchGrid(Method[tuple[torch.Tensor, torch.Tensor]]):
    """BagNet-like fixed groups: square ``patch_size × patch_size`` blocks of the feature grid
    (default: the smallest size giving at most ``max_groups`` patches), or ``max_groups``
    contiguous spans of the candidate tokens for text.  Logits are the mean of the patch
    logits, ``α_i = y_i / m``.  At sparsity τ the ``max(1, floor(τ·m))`` patches with the
    largest (``largest=False``: smallest) contribution to the full-input prediction are kept
    and summed — "removing patches from the aggregation" (per output for regression).
    """

    def __init__(self, patch_size: int | None = None, max_groups: int = FORWARD_BUDGET):
        check_int("patch_size", patch_size, 1, optional=True)
        check_int("max_groups", max_groups, 1)
        self.name = "PatchGrid"
        self.patch_size = patch_size
        self.max_groups = max_groups

    def prepare(self, model: SOP, inputs: FeatureInputs, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        ids, m = patch_ids(model, inputs, self.patch_size, self.max_groups)
        masks = ids.unsqueeze(1) == torch.arange(m, device=ids.device).view(1, m, 1)
        return masks, run_masks(model, inputs, masks, mode).logits.float()

    def predict(
        self,
        model: SOP,
        inputs: FeatureInputs,
        state: tuple[torch.Tensor, torch.Tensor],
        tau: float | None,
        largest: bool | None,
        mode: str,
        num_groups: int | None = None,
    ) -> Prediction:
        masks, y = state
        m = y.shape[1]
        alpha = y.transpose(1, 2) / m
        if tau is None:
            kept = torch.ones_like(alpha, dtype=torch.bool)
        else:
            kept = _top_patches(alpha, model.task, max(1, int(tau * m)), largest is not False)
        return Prediction((alpha * kept).sum(-1), alpha * kept, masks, kept, y)


def _top_patches(alpha: torch.Tensor, task: str, n: int, largest: bool) -> torch.Tensor:
    """``[B, C, m]`` bool: the ``n`` patches with the extreme contribution (to the predicted class,
    or to each output for regression)."""
    ranking = alpha
    if task != "regression":
        pred = alpha.sum(-1).argmax(-1)
        ranking = alpha.gather(1, pred.view(-1, 1, 1).expand(-1, 1, alpha.shape[-1])).expand_as(alpha)
    order = torch.sort(ranking, dim=-1, descending=largest, stable=True).indices[..., :n]
    return torch.zeros_like(alpha, dtype=torch.bool).scatter_(-1, order, True)


def patch_ids(model: SOP, inputs: FeatureInputs, patch_size: int | None, max_groups: int) -> tuple[torch.Tensor, int]:
    """``([B, d] patch id per feature, -1 for non-candidates; m)`` for :class:`PatchGrid`."""
    valid = candidate_mask(model, inputs)
    grid = model.adapter.feature_grid(inputs)
    if grid is not None:
        h, w = grid
        p = patch_size or next(s for s in range(1, max(h, w) + 1) if math.ceil(h / s) * math.ceil(w / s) <= max_groups)
        cols = math.ceil(w / p)
        rows = torch.arange(h, device=valid.device) // p
        ids = (rows.view(-1, 1) * cols + torch.arange(w, device=valid.device).view(1, -1) // p).flatten()
        m = math.ceil(h / p) * cols
        ids = ids.expand_as(valid)
    else:
        counts = valid.sum(dim=1, keepdim=True)
        m = min(max_groups, int(counts.min()))
        rank = valid.long().cumsum(dim=1) - 1
        ids = rank * m // counts.clamp_min(1)
    return torch.where(valid, ids, torch.full_like(ids, -1)), m


# -- registry -------------------------------------------------------------------------------
def _attribution(name: str, fn: AttributionFn) -> Callable[..., Method]:
    return lambda: AttributionBaseline(name, fn)


def _captum_baseline(name: str, method: str) -> Callable[..., Method]:
    return lambda **kw: AttributionBaseline(name, captum_attribution(method, **kw))


BASELINES: dict[str, Callable[..., Method]] = {
    "gxi-f": _attribution("GxI-F", gradient_x_input),
    "gradcam-f": _attribution("GradCAM-F", grad_cam),
    "ig-f": _captum_baseline("IG-F", "ig"),
    "occlusion-f": _captum_baseline("Occlusion-F", "occlusion"),
    "lime-f": _captum_baseline("LIME-F", "lime"),
    "kernelshap-f": _captum_baseline("KernelSHAP-F", "kernelshap"),
    "rise-f": lambda **kw: AttributionBaseline("RISE-F", rise_attribution(**kw)),
    "fresh": Fresh,
    "random": RandomGroups,
    "patches": PatchGrid,
}
_NEEDS = {"ig-f": "ig", "occlusion-f": "occlusion", "lime-f": "lime", "kernelshap-f": "kernelshap"}


def available_baselines() -> list[str]:
    """Names :func:`make_baseline` accepts here (the Captum ones only when Captum is installed)."""
    return [n for n in BASELINES if n not in _NEEDS or captum_available(_NEEDS[n])]


def make_baseline(name: str, **kwargs) -> Method:
    """Build a baseline by name (case-insensitive): one of :data:`BASELINES`'s keys."""
    if not isinstance(name, str) or name.lower() not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; allowed: {sorted(BASELINES)}")
    return BASELINES[name.lower()](**kwargs)


__all__ = [
    "BASELINES",
    "CAPTUM_METHODS",
    "AttributionBaseline",
    "Fresh",
    "Method",
    "PatchGrid",
    "Prediction",
    "RandomGroups",
    "SOPMethod",
    "ScoreBaseline",
    "available_baselines",
    "backbone_logits",
    "candidate_mask",
    "captum_attribution",
    "captum_available",
    "cls_attention",
    "combine_groups",
    "grad_cam",
    "gradient_x_input",
    "has_cls_attention",
    "make_baseline",
    "patch_ids",
    "rise_attribution",
    "run_masks",
    "soft_forward",
    "top_tau_masks",
]
