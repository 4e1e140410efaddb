"""Hugging Face convolutional classifiers (``ResNetForImageClassification``,
``ConvNextForImageClassification``): the CNN adapter with the feature grid of their second-to-last
stage (a ResNet-50's 14×14 at 224 pixels, like torchvision's ``layer3``)."""

from __future__ import annotations

from typing import Any

from torch import nn

from .cnn import CNNAdapter
from .registry import builtin_adapter, hf_classifier


class HFStagesAdapter(CNNAdapter):
    """An HF CNN whose ``base_model`` holds ``encoder.stages``; the feature layer is the second-to-last stage."""

    base_model = "resnet"

    @classmethod
    def defaults(cls, backbone: nn.Module) -> dict[str, Any]:
        model: Any = backbone
        stage = len(getattr(model, cls.base_model).encoder.stages) - 2
        return {
            "feature_layer": f"{cls.base_model}.encoder.stages.{stage}",
            "embed_dim": model.config.hidden_sizes[stage],
        }


@builtin_adapter("hf-resnet", hf_classifier("ResNetForImageClassification"))
class HFResNetAdapter(HFStagesAdapter):
    family = "Hugging Face ResNetForImageClassification"


@builtin_adapter("hf-convnext", hf_classifier("ConvNextForImageClassification"))
class HFConvNextAdapter(HFStagesAdapter):
    family = "Hugging Face ConvNextForImageClassification"
    base_model = "convnext"
