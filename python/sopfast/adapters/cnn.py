"""Adapter for convolutional classifiers (any ``nn.Module`` with a conv feature map and a final
``nn.Linear``).

The feature grid is the spatial grid of a named layer's output (``feature_layer``); the
generator reads that layer from its trainable copy.  Groups mask pixels with the grid mask
upsampled (nearest) to the image, chunk by chunk — no ``[B, m, H, W]`` mask is built.  Keys
are the classifier's input (the penultimate dense activation).  CNNs have no token axis, so
only ``exact`` runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..checks import check_int
from ..types import FeatureInputs, GroupPredictions, Groups
from .base import BackboneAdapter, freeze_, run_chunked
from .images import parameter_dtype, pixel_grid_mask, prepare_pixels
from .registry import builtin_adapter


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted activation is captured."""


def _last_linear(model: nn.Module) -> str | None:
    names = [name for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    return names[-1] if names else None


def _channels_of(module: nn.Module) -> int | None:
    for mod in reversed(list(module.modules())):
        if isinstance(mod, nn.Conv2d):
            return int(mod.out_channels)
        if isinstance(mod, nn.BatchNorm2d):
            return int(mod.num_features)
    return None


@builtin_adapter(lambda model: any(isinstance(m, nn.Conv2d) for m in model.modules()), order=100)
class CNNAdapter(BackboneAdapter):
    """Any CNN classifier: the feature grid is ``feature_layer``'s output grid (module docstring).

    Args:
        feature_layer: the module (a ``named_modules`` name) whose ``[B, E, h, w]`` output is the
            feature grid, e.g. ``layer3`` for a ResNet (required).
        classifier: the final ``nn.Linear`` whose weight starts the selector's queries and whose
            input is the group key (default: the last ``nn.Linear``).
        embed_dim: the channel count of ``feature_layer``'s output, when it cannot be read off it.
    """

    family = "CNNs (Conv2d features, give feature_layer=)"
    modality = "image"
    supported_modes = ("exact",)

    @classmethod
    def adapter_options(cls, backbone: nn.Module, **given: Any) -> dict[str, Any]:
        """``feature_layer`` (required), ``classifier``, ``embed_dim`` (see the class docstring)."""
        feature_layer = given.pop("feature_layer", None)
        options = {k: given.pop(k) for k in ("classifier", "embed_dim") if given.get(k) is not None}
        super().adapter_options(backbone, **given)
        if feature_layer is None:
            raise ValueError(
                "CNN backbones need feature_layer=NAME (--feature-layer): the module whose [B, E, h, w] output is "
                "the feature grid (e.g. layer3 for a ResNet)"
            )
        if feature_layer not in dict(backbone.named_modules()):
            raise ValueError(f"feature_layer (--feature-layer) {feature_layer!r} is not a module of the backbone")
        return {"feature_layer": feature_layer, **options}

    def __init__(
        self,
        backbone: nn.Module,
        feature_layer: str | None = None,
        classifier: str | None = None,
        embed_dim: int | None = None,
    ):
        super().__init__(backbone)
        modules = dict(backbone.named_modules())
        if feature_layer is None:
            raise ValueError(
                "CNN backbones need feature_layer=<module name> whose output [B, E, h, w] defines the "
                f"feature grid; candidates: {[n for n, m in modules.items() if isinstance(m, nn.Conv2d)][-5:]}"
            )
        if feature_layer not in modules:
            raise ValueError(f"feature_layer={feature_layer!r} is not a module of the backbone")
        self.feature_layer = feature_layer
        classifier = classifier or _last_linear(backbone)
        if classifier is not None and not isinstance(modules.get(classifier), nn.Linear):
            raise ValueError(f"classifier={classifier!r} must name an nn.Linear module of the backbone")
        self.classifier_name = classifier
        self.classifier = modules[classifier] if classifier is not None else None
        inferred = _channels_of(modules[feature_layer])
        dim = check_int("embed_dim", embed_dim, 1, optional=True) or inferred
        if dim is None:
            raise ValueError(f"cannot infer the channel count of {feature_layer!r}; pass embed_dim=")
        if inferred is not None and dim != inferred:
            raise ValueError(f"embed_dim must be the {inferred} channels of {feature_layer!r}, got {dim}")
        self._embed_dim = dim
        first_conv = next((m for m in backbone.modules() if isinstance(m, nn.Conv2d)), None)
        self.channels = int(first_conv.in_channels) if first_conv is not None else None
        self._grids: dict[tuple[int, int], tuple[int, int]] = {}

    def prepare(self, x, attention_mask=None, token_type_ids=None) -> FeatureInputs:
        return prepare_pixels(x, self.channels, None, parameter_dtype(self.backbone))

    @property
    def embed_dim(self) -> int:
        return self._embed_dim

    def _feature_map(self, model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        captured: list[torch.Tensor] = []

        def hook(_module, _inputs, output):
            captured.append(output)
            raise _Stop

        handle = dict(model.named_modules())[self.feature_layer].register_forward_hook(hook)
        try:
            model(pixels)
        except _Stop:
            pass
        finally:
            handle.remove()
        fmap = captured[0]
        if fmap.dim() != 4:
            raise ValueError(f"feature_layer {self.feature_layer!r} must output [B, E, h, w], got {tuple(fmap.shape)}")
        return fmap

    def feature_grid(self, inputs: FeatureInputs) -> tuple[int, int]:
        pixels = inputs.require_pixels()
        size = (pixels.shape[-2], pixels.shape[-1])
        if size not in self._grids:
            with torch.no_grad():
                fmap = self._feature_map(self.backbone, pixels[:1])
            self._grids[size] = (int(fmap.shape[-2]), int(fmap.shape[-1]))
        return self._grids[size]

    def num_features(self, inputs: FeatureInputs) -> int:
        h, w = self.feature_grid(inputs)
        return h * w

    def make_projection(self) -> nn.Module:
        projection = super().make_projection()
        if self.classifier_name is not None:
            freeze_(dict(projection.named_modules())[self.classifier_name])
        return projection

    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        features = self._feature_map(projection, inputs.require_pixels())
        if features.shape[1] != self._embed_dim:
            raise ValueError(
                f"embed_dim={self._embed_dim} but {self.feature_layer!r} gives {features.shape[1]} channels"
            )
        return features.flatten(2).transpose(1, 2)

    def classifier_weight(self) -> torch.Tensor:
        if self.classifier is None:
            raise ValueError(
                "the CNN backbone has no nn.Linear classifier (pass classifier=<name>) to copy; "
                "give class_weights=[C, E] to SOP (keys are then the pooled feature map)"
            )
        return self.classifier.weight

    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and keys: the classifier's input, or the pooled feature map without a classifier."""
        captured: list[torch.Tensor] = []
        if self.classifier is not None:
            handle = self.classifier.register_forward_pre_hook(lambda _m, args: captured.append(args[0].flatten(1)))
        else:
            layer = dict(self.backbone.named_modules())[self.feature_layer]
            handle = layer.register_forward_hook(lambda _m, _i, out: captured.append(out.mean(dim=(2, 3))))
        try:
            logits = self.backbone(inputs.pixels)
        finally:
            handle.remove()
        return logits, captured[0]

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return dict(self.backbone.named_modules())[self.feature_layer], False, 0

    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        b, m, d = groups.mask.shape
        grid = self.feature_grid(inputs)
        pixels = inputs.require_pixels()
        size = (pixels.shape[-2], pixels.shape[-1])
        flat_mask = groups.mask.reshape(b * m, d)

        def run(rows: slice, example: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            masked = pixels[example] * pixel_grid_mask(flat_mask[rows], grid, size)
            return self.full_forward(FeatureInputs(pixels=masked))

        return run_chunked(groups, chunk_size, run)
