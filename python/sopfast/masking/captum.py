"""Captum's perturbation explainers on sopfast's masked forward: features are the adapter's patches
or tokens, an ablated feature is a removed one, and in ``drop`` mode only the kept tokens run.

    forward = MaskedForward(backbone, images)       # exact for a ViT, drop for BERT (the faithful mode)
    attributions = KernelShap(forward).attribute(forward.presence, target=labels, n_samples=200,
                                                 additional_forward_args=forward.example_ids)
    heatmaps = forward.to_input(attributions)                  # [B, H, W] for images, [B, T] for text

Captum perturbs ``presence [B, d]`` (1 = the feature is there; its baseline is 0) and calls the
forward with the perturbed rows and their example ids; the forward runs each row as a mask on its
example.  Works with ``Occlusion``, ``FeatureAblation``, ``Lime``, ``KernelShap`` and
``ShapleyValueSampling`` (the tests run each), with any ``perturbations_per_eval``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..adapters import BackboneAdapter
from ..adapters.images import upsample_mask
from ..checks import check_bool, check_class_ids, check_int, check_values
from .forward import MASKED_TOKENS_PER_CALL, InputsLike, adapter_of, explainer_mode, feature_inputs, run_masked


class MaskedForward(nn.Module):
    """A Captum forward function over feature presence: ``forward(presence [N, d], example_ids [N])``
    → logits ``[N, C]``, each row run as the mask ``presence > 0.5`` on example ``example_ids[n]`` of
    the ``inputs`` given at construction (see the module docstring).

    ``mode``: ``None`` (default) is the backbone's faithful mode — ``exact`` for a ViT, ``drop`` for BERT,
    whose ``drop`` computes the same logits (:func:`~sopfast.masking.forward.explainer_mode`).

    Attributes:
        presence: ``[B, d]`` ones: the input to attribute (its baseline is 0, the default).
        example_ids: ``(arange(B),)``: pass as ``additional_forward_args``.
    """

    def __init__(
        self,
        backbone: nn.Module | BackboneAdapter,
        inputs: InputsLike,
        *,
        mode: str | None = None,
        tokens_per_call: int = MASKED_TOKENS_PER_CALL,
        probabilities: bool = False,
    ):
        super().__init__()
        self.adapter = adapter_of(backbone)
        self.tokens_per_call = check_int("tokens_per_call", tokens_per_call, 1)
        self.probabilities = check_bool("probabilities", probabilities)
        self.inputs = feature_inputs(self.adapter, inputs)
        self.mode = explainer_mode(self.adapter, mode, self.inputs)
        valid = self.adapter.candidate_mask(self.inputs)
        self.presence = valid.float()
        self.example_ids = (torch.arange(self.inputs.batch_size, device=self.inputs.device),)
        self.calls = 0

    def forward(self, presence: torch.Tensor, example_ids: torch.Tensor) -> torch.Tensor:
        if presence.dim() != 2 or presence.shape[1] != self.presence.shape[1]:
            raise ValueError(
                f"presence must be [N, d] with d = {self.presence.shape[1]} features, got {list(presence.shape)}; "
                "attribute forward.presence"
            )
        if example_ids.shape != presence.shape[:1]:
            raise ValueError(
                f"example_ids must be [N] = [{presence.shape[0]}], got {list(example_ids.shape)}; "
                "pass additional_forward_args=forward.example_ids"
            )
        example_ids = check_class_ids("example_ids", example_ids, self.inputs.batch_size, "examples")
        check_values(torch.isfinite(presence).all(), "presence must be finite (1 = the feature is there, 0 = not)")
        example_ids = example_ids.to(self.inputs.device).long()
        masks = (presence.to(self.inputs.device) > 0.5) & self.presence.bool()[example_ids]
        self.calls += 1
        out = run_masked(self.adapter, self.inputs, example_ids, masks, self.mode, self.tokens_per_call, True)
        logits = out.logits.float()
        return logits.softmax(-1) if self.probabilities else logits

    def to_input(self, attributions: torch.Tensor) -> torch.Tensor:
        """Feature attributions ``[B, d]`` in the input's layout: ``[B, H, W]`` per pixel for image
        backbones with a feature grid (each feature's value over its patch), else ``[B, d]``."""
        grid = self.adapter.feature_grid(self.inputs)
        pixels = self.inputs.pixels
        if grid is None or pixels is None:
            return attributions
        return upsample_mask(attributions.reshape(-1, *grid), (pixels.shape[-2], pixels.shape[-1]))
