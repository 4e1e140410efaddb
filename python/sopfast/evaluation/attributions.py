"""Per-feature attributions of the frozen backbone, for the "-F" baselines: gradient × input,
Grad-CAM, Captum's Integrated Gradients / Occlusion / LIME / KernelSHAP, and the CLS attention
FRESH reads.  Each is an :data:`AttributionFn` ``(model, inputs, target [B]) → [B, d]``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..checks import check_int
from ..masking import EXPLAINERS
from ..types import FeatureInputs

if TYPE_CHECKING:
    from ..model.sop import SOP

# (model, inputs, target [B], mode) → [B, d]; gradient methods run the full input whatever the mode
AttributionFn = Callable[["SOP", FeatureInputs, torch.Tensor, str], torch.Tensor]
FORWARD_BUDGET = 20


def soft_forward(model: SOP, inputs: FeatureInputs, z: torch.Tensor) -> torch.Tensor:
    """Backbone logits ``[N, C]`` with each feature scaled by its presence ``z [N, d] ∈ [0, 1]``
    (differentiable in ``z``): the adapter's :meth:`~sopfast.adapters.BackboneAdapter.soft_forward`."""
    return model.adapter.soft_forward(inputs, z)


def _pick(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return logits.float().gather(1, target.view(-1, 1).to(logits.device)).sum()


def gradient_x_input(model: SOP, inputs: FeatureInputs, target: torch.Tensor, mode: str = "exact") -> torch.Tensor:
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


def grad_cam(model: SOP, inputs: FeatureInputs, target: torch.Tensor, mode: str = "exact") -> torch.Tensor:
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


#: The Captum methods of the "-F" baselines (:data:`sopfast.masking.EXPLAINERS`).
CAPTUM_METHODS = ("ig", "occlusion", "lime", "kernelshap")


def captum_available(method: str = "ig") -> bool:
    """Whether Captum (and scikit-learn for LIME / KernelSHAP) can be imported."""
    return not EXPLAINERS[method].missing()


def captum_attribution(
    method: str, budget: int = FORWARD_BUDGET, window: int = 1, mode: str | None = None
) -> AttributionFn:
    """A Captum attribution over the ``d`` features, as an :data:`AttributionFn`: the explainer ``method``
    of :data:`sopfast.masking.EXPLAINERS`.

    ``"ig"``: Integrated Gradients from the blank input along :func:`soft_forward`, ``budget``
    steps.  ``"lime"`` / ``"kernelshap"``: ``budget`` binary feature masks per example;
    ``"occlusion"``: removes ``window`` consecutive features at a time (``d / window`` passes, not
    matchable to the budget).  The perturbed inputs run on :class:`sopfast.masking.MaskedForward`
    in ``mode`` — by default the backbone's faithful mode (``exact`` for a ViT, whose ``drop`` computes
    another function; ``drop`` for BERT), whatever mode the evaluation scores the groups in.  Needs
    ``pip install captum`` (LIME and KernelSHAP also scikit-learn).
    """
    if method not in CAPTUM_METHODS:
        raise ValueError(f"method must be one of {CAPTUM_METHODS}, got {method!r}")
    check_int("budget", budget, 1)
    check_int("window", window, 1)
    if not captum_available(method):
        raise ImportError(f"the {method!r} baseline needs Captum (and scikit-learn): pip install captum scikit-learn")
    explainer = EXPLAINERS[method]
    options = {"window": window} if method == "occlusion" else explainer.budget(budget)

    def attribute(model: SOP, inputs: FeatureInputs, target: torch.Tensor, _group_mode: str = "exact") -> torch.Tensor:
        extra = dict(options)
        if method == "ig":  # the interpolated inputs in calls of SOP's chunk size
            extra["internal_batch_size"] = model.group_chunk_size(model.adapter.num_features(inputs) + 1)
        return explainer(model.adapter, inputs, target, mode=mode, **extra)

    return attribute


def rise_attribution(
    num_masks: int = FORWARD_BUDGET, keep: float = 0.5, cells: int = 7, mode: str | None = None
) -> AttributionFn:
    """RISE (:func:`sopfast.masking.rise`) with ``num_masks`` random masks per example, as an
    :data:`AttributionFn` running its masks in ``mode`` (default: the backbone's faithful mode, as
    :func:`captum_attribution`)."""
    check_int("num_masks", num_masks, 1)

    def attribute(model: SOP, inputs: FeatureInputs, target: torch.Tensor, _group_mode: str = "exact") -> torch.Tensor:
        return EXPLAINERS["rise"](model.adapter, inputs, target, mode=mode, num_masks=num_masks, keep=keep, cells=cells)

    return attribute


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
