"""Adapter for convolutional classifiers (any ``nn.Module`` with a conv feature map and a final
``nn.Linear``), and the base of the families that run like one.

The feature grid is the spatial grid of a named layer's output (``feature_layer``); the
generator reads that layer from its trainable copy.  Groups mask pixels with the grid mask
upsampled (nearest) to the image, chunk by chunk — no ``[B, m, H, W]`` mask is built.  Keys
are the classifier's input (the penultimate dense activation).  CNNs have no token axis, so
only ``exact`` runs.

A family with a known layout is a subclass with :meth:`CNNAdapter.defaults` (its feature layer:
torchvision ResNets ``layer3``, ``adapters/hf_cnn.py``); one whose feature map is a layer's input or
a token sequence sets :attr:`CNNAdapter.feature_from_input` and :meth:`CNNAdapter.to_grid` (Swin, BEiT).
The generic ``cnn`` adapter claims no model with attention layers: a Transformer is never taken for a CNN.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..checks import check_int
from ..types import FeatureInputs, GroupPredictions, Groups
from .base import BackboneAdapter, StopForward, freeze_, run_chunked
from .images import parameter_dtype, pixel_grid_mask, prepare_pixels
from .registry import builtin_adapter, class_names


def _last_linear(model: nn.Module) -> str | None:
    names = [name for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    return names[-1] if names else None


def _is_transformer(model: nn.Module) -> bool:
    """Whether ``model`` has attention layers (``nn.MultiheadAttention`` or a class named ``…Attention…``)."""
    return any(isinstance(m, nn.MultiheadAttention) or "Attention" in type(m).__name__ for m in model.modules())


def _is_cnn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules()) and not _is_transformer(model)


def model_logits(output: Any) -> torch.Tensor:
    """A classifier's logits: its output, or the output's ``logits`` (a Hugging Face model's)."""
    return output if isinstance(output, torch.Tensor) else output.logits


def module_name(root: nn.Module, module: nn.Module) -> str:
    """The ``named_modules`` name of ``module`` inside ``root``."""
    return next(name for name, m in root.named_modules() if m is module)


def _channels_of(module: nn.Module) -> int | None:
    for mod in reversed(list(module.modules())):
        if isinstance(mod, nn.Conv2d):
            return int(mod.out_channels)
        if isinstance(mod, nn.BatchNorm2d):
            return int(mod.num_features)
    return None


@builtin_adapter("cnn", _is_cnn, generic=True)
class CNNAdapter(BackboneAdapter):
    """Any CNN classifier: the feature grid is ``feature_layer``'s output grid (module docstring).

    Args:
        feature_layer: the module (a ``named_modules`` name) whose ``[B, E, h, w]`` output is the
            feature grid, e.g. ``layer3`` for a ResNet (required, except for the families that know theirs).
        classifier: the final ``nn.Linear`` whose weight starts the selector's queries and whose
            input is the group key (default: the last ``nn.Linear``).
        embed_dim: the channel count of ``feature_layer``'s output, when it cannot be read off it.
    """

    family = "CNNs (Conv2d features, give feature_layer=)"
    modality = "image"
    supported_modes = ("exact",)
    mode_refusal = "a CNN has no token axis to drop from"
    #: Whether the feature map is ``feature_layer``'s input (then :meth:`to_grid` gets its positional
    #: arguments) rather than its output.
    feature_from_input = False

    @classmethod
    def defaults(cls, backbone: nn.Module) -> dict[str, Any]:
        """The ``feature_layer`` (and ``embed_dim``) this family uses when none is given."""
        return {}

    @classmethod
    def adapter_options(cls, backbone: nn.Module, **given: Any) -> dict[str, Any]:
        """``feature_layer`` (required without a family default), ``classifier``, ``embed_dim``."""
        feature_layer = given.pop("feature_layer", None)
        options = {k: given.pop(k) for k in ("classifier", "embed_dim") if given.get(k) is not None}
        super().adapter_options(backbone, **given)
        if feature_layer is None and "feature_layer" in cls.defaults(backbone):
            return options
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
        defaults = self.defaults(backbone)
        feature_layer = feature_layer or defaults.get("feature_layer")
        embed_dim = embed_dim or defaults.get("embed_dim")
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
        return prepare_pixels(x, self.channels, self.image_size, parameter_dtype(self.backbone))

    @property
    def embed_dim(self) -> int:
        return self._embed_dim

    def _feature_map(self, model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        captured: list[torch.Tensor] = []

        def hook(_module, inputs, output=None):
            captured.append(inputs if self.feature_from_input else output)
            raise StopForward

        layer = dict(model.named_modules())[self.feature_layer]
        register = layer.register_forward_pre_hook if self.feature_from_input else layer.register_forward_hook
        handle = register(hook)
        try:
            model(pixels)
        except StopForward:
            pass
        finally:
            handle.remove()
        return self.to_grid(captured[0])

    def to_grid(self, captured: Any) -> torch.Tensor:
        """The feature map ``[B, E, h, w]`` from what the hook on ``feature_layer`` captured: its output (its
        positional arguments with :attr:`feature_from_input`)."""
        if not isinstance(captured, torch.Tensor) or captured.dim() != 4:
            shape = tuple(captured.shape) if isinstance(captured, torch.Tensor) else type(captured).__name__
            raise ValueError(f"feature_layer {self.feature_layer!r} must output [B, E, h, w], got {shape}")
        return captured

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
            logits = model_logits(self.backbone(inputs.pixels))
        finally:
            handle.remove()
        return logits, captured[0]

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        return dict(self.backbone.named_modules())[self.feature_layer], self.feature_from_input, self.num_prefix_tokens

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


def _is_torchvision_resnet(model: nn.Module) -> bool:
    return "ResNet" in class_names(model) and type(model).__module__.startswith("torchvision")


@builtin_adapter("torchvision-resnet", _is_torchvision_resnet)
class TorchvisionResNetAdapter(CNNAdapter):
    """torchvision ResNets: the feature grid is ``layer3``'s output (14×14 at 224 pixels)."""

    family = "torchvision ResNet (resnet18, resnet50 …; feature layer layer3)"

    @classmethod
    def defaults(cls, backbone: nn.Module) -> dict[str, Any]:
        return {"feature_layer": "layer3"}
