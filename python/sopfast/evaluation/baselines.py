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
  forward passes where the method allows.
* **FRESH** (:class:`Fresh`): one group from attention — the backbone's last-layer CLS
  attention (Transformers) or the mean of the SOP generator's attention rows.
* **Random groups** (:class:`RandomGroups`): ``m`` random groups of ``k`` features, combined by
  SOP's trained selector — SOP without a learned generator.
* **Patch grid** (:class:`PatchGrid`): fixed square patches of the feature grid (contiguous
  token spans for text) whose logits are averaged, BagNet-style; sparsity keeps the patches
  that contribute most, as the paper does for BagNet.

A baseline is a :class:`Method`: :meth:`Method.prepare` does the per-batch work that does not
depend on the sparsity, :meth:`Method.predict` returns a :class:`Prediction` at a sparsity τ.
"""

from __future__ import annotations

import importlib.util
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import torch
from torch import nn

from ..checks import check_int
from ..ops import aggregate, top_tau
from ..types import FeatureInputs, GroupPredictions, Groups

if TYPE_CHECKING:
    from ..model.sop import SOP

AttributionFn = Callable[["SOP", FeatureInputs, torch.Tensor], torch.Tensor]
COMBINES = ("mean", "selector", "per_output")
FORWARD_BUDGET = 20
INPUT_FIELDS = ("pixels", "input_ids", "attention_mask", "token_type_ids")
#: What a :class:`Method`'s :meth:`~Method.prepare` hands to its :meth:`~Method.predict`.
StateT = TypeVar("StateT")


@dataclass
class Prediction:
    """A self-attributing prediction: ``logits [B, C]``, ``attributions [B, C, m]`` (summing to the
    logits), ``group_masks [B, m, d]`` bool and ``used [B, C, m]`` (the groups each class uses)."""

    logits: torch.Tensor
    attributions: torch.Tensor
    group_masks: torch.Tensor
    used: torch.Tensor


class Method(ABC, Generic[StateT]):
    """Something :func:`sopfast.evaluate` can score: it makes groups and predicts from them.

    ``StateT`` is the type of the per-batch state :meth:`prepare` returns and :meth:`predict` takes.
    """

    name: str = "method"

    def prepare(self, model: SOP, inputs: FeatureInputs, mode: str) -> StateT:
        """Per-batch work independent of the sparsity (attributions, attention); passed to :meth:`predict`.

        The default does no work and returns ``None`` (a subclass keeping it is a ``Method[None]``)."""
        # The type system cannot tie "StateT is None" to "prepare is not overridden".
        return cast(StateT, None)

    @abstractmethod
    def predict(
        self, model: SOP, inputs: FeatureInputs, state: StateT, tau: float | None, largest: bool | None, mode: str
    ) -> Prediction:
        """Predict with groups of sparsity ``tau`` (``None``: the model's τ) holding the highest-ranked
        features (``largest=False``: the lowest; ``None``: the method's own choice)."""


# -- shared group execution -----------------------------------------------------------------
def candidate_mask(model: SOP, inputs: FeatureInputs) -> torch.Tensor:
    """``[B, d]`` bool: the features that may join a group."""
    return model.adapter.candidate_mask(inputs)


def top_tau_masks(scores: torch.Tensor, valid: torch.Tensor, tau: float, largest: bool = True) -> torch.Tensor:
    """``[B, m, d]`` bool: per row of ``scores [B, m, d]`` the top-τ valid features (SOP's rule:
    ``k = max(1, floor(τ·d_valid))``, ties to the lower index)."""
    b, m, d = scores.shape
    rows_valid = None if bool(valid.all()) else valid.unsqueeze(1).expand(b, m, d).reshape(b * m, d)
    flat = torch.nan_to_num(scores.detach().float(), nan=0.0).reshape(b * m, d)
    return top_tau(flat, tau, valid=rows_valid, largest=largest, ties="logits").mask.view(b, m, d)


def masks_to_groups(masks: torch.Tensor) -> Groups:
    """Wrap bool ``masks [B, P, d]`` as :class:`Groups` (ascending ``-1``-padded indices, ``λ = 1``)."""
    b, p, d = masks.shape
    k_max = max(1, int(masks.sum(dim=-1).max())) if masks.numel() else 1
    pos = torch.arange(d, device=masks.device).expand_as(masks)
    idx = torch.sort(torch.where(masks, pos, pos + d), dim=-1).values[..., :k_max]
    idx = torch.where(idx < d, idx, torch.full_like(idx, -1))
    return Groups(mask=masks, indices=idx, lam=masks.new_ones(b, p, dtype=torch.float32), attention=masks.float())


def run_masks(model: SOP, inputs: FeatureInputs, masks: torch.Tensor, mode: str) -> GroupPredictions:
    """The frozen backbone on every mask of ``masks [B, P, d]`` → logits ``[B, P, C]``, keys ``[B, P, H]``.

    ``drop`` on an image backbone needs equal-size groups (``-1`` padding would add zero tokens
    that attend); masks of different sizes therefore run ``exact`` there.
    """
    sizes = masks.sum(dim=-1)
    if mode == "drop" and model.adapter.modality == "image" and bool((sizes != sizes.flatten()[:1]).any()):
        mode = "exact"
    with torch.no_grad():
        groups = masks_to_groups(masks)
        chunk = model.group_chunk_size(model.adapter.tokens_per_group(inputs, groups, mode))
        return model.adapter.run_groups(inputs, groups, mode, chunk)


def combine_groups(model: SOP, preds: GroupPredictions, masks: torch.Tensor, how: str) -> Prediction:
    """Turn group predictions into a :class:`Prediction`.

    ``"mean"``: average of the group logits (BagNet); ``"selector"``: SOP's trained selector
    with ``λ = 1``; ``"per_output"``: group ``c`` alone predicts output ``c`` (needs ``m = C``).
    """
    y = preds.logits.float()
    b, m, c = y.shape
    if how == "mean":
        alpha = y.transpose(1, 2) / m
        return Prediction(alpha.sum(-1), alpha, masks, torch.ones_like(alpha, dtype=torch.bool))
    if how == "selector":
        with torch.no_grad():
            scores = model.selector(preds.keys)
            logits = aggregate(scores, masks.new_ones(b, m, dtype=torch.float32), preds.logits)
        return Prediction(logits.float(), scores * y.transpose(1, 2), masks, scores > 0)
    if how == "per_output":
        if m != c:
            raise ValueError(f"combine='per_output' needs one group per output (m = C = {c}), got m={m}")
        eye = torch.eye(c, dtype=torch.bool, device=y.device).expand(b, c, c)
        alpha = y.transpose(1, 2) * eye
        return Prediction(alpha.sum(-1), alpha, masks, eye.clone())
    raise ValueError(f"combine must be one of {COMBINES}, got {how!r}")


def backbone_logits(model: SOP, inputs: FeatureInputs) -> torch.Tensor:
    """``[B, C]``: the plain backbone on the full input."""
    with torch.no_grad():
        return model.adapter.full_forward(inputs)[0].float()


# -- score-based baselines ------------------------------------------------------------------
class ScoreBaseline(Method[torch.Tensor]):
    """Groups are the top-τ features of per-group scores ``[B, m, d]``; the backbone predicts on each."""

    combine: str = "mean"

    @abstractmethod
    def scores(self, model: SOP, inputs: FeatureInputs) -> torch.Tensor:
        """``[B, m, d]`` feature scores, one row per group (higher = kept first)."""

    def combine_mode(self, model: SOP) -> str:
        return self.combine

    def prepare(self, model: SOP, inputs: FeatureInputs, mode: str) -> torch.Tensor:
        return self.scores(model, inputs).detach()

    def predict(
        self, model: SOP, inputs: FeatureInputs, state: torch.Tensor, tau: float | None, largest: bool | None, mode: str
    ) -> Prediction:
        tau = model.tau if tau is None else tau
        masks = top_tau_masks(state, candidate_mask(model, inputs), tau, largest is not False)
        return combine_groups(model, run_masks(model, inputs, masks, mode), masks, self.combine_mode(model))


class AttributionBaseline(ScoreBaseline):
    """ "-F": the top-τ features of ``attribute(model, inputs, target) → [B, d]`` form one group.

    The target is the backbone's full-input prediction (classification) or, for regression,
    each output in turn (one group per output, ``combine="per_output"``).
    """

    def __init__(self, name: str, attribute: AttributionFn):
        self.name = name
        self.attribute = attribute

    def combine_mode(self, model: SOP) -> str:
        return "per_output" if model.task == "regression" else "mean"

    def scores(self, model: SOP, inputs: FeatureInputs) -> torch.Tensor:
        logits = backbone_logits(model, inputs)
        if model.task == "regression":
            rows = [
                self.attribute(model, inputs, torch.full_like(logits[:, 0], c, dtype=torch.long))
                for c in range(logits.shape[1])
            ]
            return torch.stack(rows, dim=1)
        return self.attribute(model, inputs, logits.argmax(dim=-1)).unsqueeze(1)


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

    def scores(self, model: SOP, inputs: FeatureInputs) -> torch.Tensor:
        source = self.source
        if source == "auto":
            source = "cls" if has_cls_attention(model) else "generator"
        with torch.no_grad():
            if source == "generator":
                return model.make_groups(inputs).attention.mean(dim=1, keepdim=True)
            return cls_attention(model, inputs).unsqueeze(1)


class RandomGroups(ScoreBaseline):
    """``num_groups`` groups of random features (seeded once), combined by SOP's selector
    (``combine="selector"``) or averaged (``"mean"``)."""

    def __init__(self, num_groups: int | None = None, seed: int = 0, combine: str = "selector"):
        if combine not in ("mean", "selector"):
            raise ValueError(f"combine must be 'mean' or 'selector', got {combine!r}")
        check_int("num_groups", num_groups, 1, optional=True)
        self.name = "Random"
        self.num_groups = num_groups
        self.combine = combine
        self.generator = torch.Generator().manual_seed(seed)

    def scores(self, model: SOP, inputs: FeatureInputs) -> torch.Tensor:
        m = self.num_groups or model.num_groups
        d = model.adapter.num_features(inputs)
        return torch.rand(inputs.batch_size, m, d, generator=self.generator).to(inputs.device)


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
    ) -> Prediction:
        masks, y = state
        m = y.shape[1]
        alpha = y.transpose(1, 2) / m
        if tau is None:
            kept = torch.ones_like(alpha, dtype=torch.bool)
        else:
            kept = _top_patches(alpha, model.task, max(1, int(tau * m)), largest is not False)
        return Prediction((alpha * kept).sum(-1), alpha * kept, masks, kept)


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


# -- attributions ---------------------------------------------------------------------------
def _fields(inputs: FeatureInputs) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    names = tuple(n for n in INPUT_FIELDS if getattr(inputs, n) is not None)
    return names, tuple(getattr(inputs, n) for n in names)


def soft_forward(model: SOP, inputs: FeatureInputs, z: torch.Tensor) -> torch.Tensor:
    """Backbone logits ``[N, C]`` with each feature scaled by its presence ``z [N, d] ∈ [0, 1]``
    (differentiable in ``z``): the adapter's :meth:`~sopfast.adapters.BackboneAdapter.soft_forward`."""
    return model.adapter.soft_forward(inputs, z)


def _pick(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return logits.float().gather(1, target.view(-1, 1).to(logits.device)).sum()


def gradient_x_input(model: SOP, inputs: FeatureInputs, target: torch.Tensor) -> torch.Tensor:
    """Gradient × input per feature ``[B, d]``: ``∂f_t/∂z`` at ``z = 1`` (:func:`soft_forward`), i.e.
    ``Σ_{pixels of the feature} x · ∂f_t/∂x`` for images.  One forward and one backward pass."""
    z = torch.ones(inputs.batch_size, model.adapter.num_features(inputs), device=inputs.device, requires_grad=True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(_pick(soft_forward(model, inputs, z), target), z)
    return grad


@contextmanager
def _captured(module: nn.Module, pre: bool) -> Iterator[list[torch.Tensor]]:
    """Replace ``module``'s input (``pre``) or output by a leaf that requires grad; yield it."""
    store: list[torch.Tensor] = []

    def leaf(t: torch.Tensor) -> torch.Tensor:
        store.append(t.detach().requires_grad_(True))
        return store[-1]

    def pre_hook(_m, args, kwargs):
        if args:
            return (leaf(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": leaf(kwargs["hidden_states"])}

    if pre:
        handle = module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    else:
        handle = module.register_forward_hook(lambda _m, _a, out: leaf(out))
    try:
        yield store
    finally:
        handle.remove()


def grad_cam(model: SOP, inputs: FeatureInputs, target: torch.Tensor) -> torch.Tensor:
    """Grad-CAM per feature ``[B, d]``: ``ReLU(Σ_e w_e A_e)`` with ``w`` the feature-averaged gradient.

    ``A`` is the CNN's ``feature_layer`` map, or the tokens entering the last Transformer block.
    """
    module, pre, prefix = model.adapter.cam_layer()
    with _captured(module, pre) as store, torch.enable_grad():
        logits = model.adapter.full_forward(inputs)[0]
        (grad,) = torch.autograd.grad(_pick(logits, target), store[-1])
    act = store[-1].detach()
    if act.dim() == 4:
        act, grad = act.flatten(2).transpose(1, 2), grad.flatten(2).transpose(1, 2)
    act, grad = act[:, prefix:], grad[:, prefix:]
    return torch.relu((act * grad.mean(dim=1, keepdim=True)).sum(-1)).float()


CAPTUM_METHODS = ("ig", "occlusion", "lime", "kernelshap")


def captum_available(method: str = "ig") -> bool:
    """Whether Captum (and scikit-learn for LIME / KernelSHAP) can be imported."""
    needed = ["captum"] + (["sklearn"] if method in ("lime", "kernelshap") else [])
    return all(importlib.util.find_spec(n) is not None for n in needed)


def captum_attribution(method: str, budget: int = FORWARD_BUDGET, window: int = 1) -> AttributionFn:
    """A Captum attribution over the ``d`` features, as an :data:`AttributionFn`.

    ``"ig"``: Integrated Gradients from the blank input along :func:`soft_forward`, ``budget``
    steps.  ``"lime"`` / ``"kernelshap"``: ``budget`` binary feature masks per example, each run
    on the masked path (exact).  ``"occlusion"``: blanks ``window`` consecutive features at a
    time — ``d / window`` passes, not matchable to the budget.  Needs ``pip install captum``
    (LIME and KernelSHAP also scikit-learn).
    """
    if method not in CAPTUM_METHODS:
        raise ValueError(f"method must be one of {CAPTUM_METHODS}, got {method!r}")
    check_int("budget", budget, 1)
    check_int("window", window, 1)
    if not captum_available(method):
        raise ImportError(f"the {method!r} baseline needs Captum (and scikit-learn): pip install captum scikit-learn")
    return lambda model, inputs, target: _captum(method, budget, window, model, inputs, target)


def _hard_forward(model: SOP, names: tuple[str, ...]) -> Callable[..., torch.Tensor]:
    def forward(z: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        batch = FeatureInputs(**dict(zip(names, tensors)))
        return run_masks(model, batch, (z > 0.5).unsqueeze(1), "exact").logits[:, 0]

    return forward


def _captum(method: str, budget: int, window: int, model: SOP, inputs: FeatureInputs, target: torch.Tensor):
    import captum.attr as ca

    names, tensors = _fields(inputs)
    ones = torch.ones(inputs.batch_size, model.adapter.num_features(inputs), device=inputs.device)
    if method == "ig":

        def forward(z, *t):
            return soft_forward(model, FeatureInputs(**dict(zip(names, t))), z)

        with torch.enable_grad():
            return (
                ca.IntegratedGradients(forward)
                .attribute(
                    ones,
                    baselines=0.0,
                    target=target,
                    additional_forward_args=tensors,
                    n_steps=budget,
                    internal_batch_size=model.group_chunk_size(ones.shape[1] + 1),
                )
                .detach()
                .float()
            )
    hard = _hard_forward(model, names)
    if method == "occlusion":
        return (
            ca.Occlusion(hard)
            .attribute(
                ones,
                sliding_window_shapes=(window,),
                strides=window,
                baselines=0.0,
                target=target,
                additional_forward_args=tensors,
                perturbations_per_eval=model.group_chunk_size(ones.shape[1] + 1),
            )
            .float()
        )
    explainer = ca.Lime(hard) if method == "lime" else ca.KernelShap(hard)
    valid = candidate_mask(model, inputs)
    rows = []
    for b in range(inputs.batch_size):
        ids = torch.where(valid[b], valid[b].long().cumsum(0) - 1, valid[b].sum()).unsqueeze(0)
        rows.append(
            explainer.attribute(
                ones[b : b + 1],
                baselines=0.0,
                target=target[b : b + 1],
                feature_mask=ids,
                additional_forward_args=tuple(t[b : b + 1] for t in tensors),
                n_samples=budget,
                perturbations_per_eval=budget,
            )
        )
    return torch.cat(rows).float()


def has_cls_attention(model: SOP) -> bool:
    """Whether :func:`cls_attention` supports ``model``'s backbone."""
    return model.adapter.has_cls_attention


def cls_attention(model: SOP, inputs: FeatureInputs) -> torch.Tensor:
    """``[B, d]``: last-layer attention from the CLS token to each feature, averaged over heads."""
    if not has_cls_attention(model):
        raise ValueError(
            f"FRESH(source='cls') needs a Transformer with a CLS token, got {type(model.adapter).__name__} "
            "(its adapter has no cls_attention); use Fresh(source='generator')"
        )
    return model.adapter.cls_attention(inputs)


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
    "masks_to_groups",
    "patch_ids",
    "run_masks",
    "soft_forward",
    "top_tau_masks",
]
