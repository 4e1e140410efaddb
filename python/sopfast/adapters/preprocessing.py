"""How raw examples become a backbone's inputs, read from where the backbone came from.

A Hugging Face directory's ``preprocessor_config.json`` (size, mean, std, resampling) and
tokenizer; timm's ``pretrained_cfg`` (mean, std, interpolation, crop_pct); the adapter's own input
size and channels; flags override size, mean and std.  torchvision models and pickled modules carry
no statistics: ImageNet's are used, and :func:`preprocessing_for` says so in ``notes``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .base import BackboneAdapter
from .sources import Backbone

if TYPE_CHECKING:
    from PIL import Image as PILImage

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class PreprocessingError(ValueError):
    """A preprocessing that cannot be built as asked (a missing tokenizer, bad statistics, a size the
    backbone does not take): the message names the file or flag."""


@dataclass
class Preprocessing:
    """How raw examples become model inputs.

    Images: converted to ``channels`` (1: grey, 3: RGB), resized (``resize_to`` the shorter side
    then centre-cropped to ``size``, or straight to ``size``), scaled by ``rescale``, normalised with
    ``mean`` / ``std`` → ``[C, H, W]`` float32.  Text: ``tokenizer`` with ``max_length`` tokens.
    """

    modality: str
    size: tuple[int, int] | None = None
    channels: int = 3
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale: float = 1 / 255
    resize_to: int | None = None
    resample: str = "bilinear"
    tokenizer: Any = None
    max_length: int = 128
    label2id: dict[str, int] = field(default_factory=dict)
    num_classes: int | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """What this preprocessing does, in plain values (to print and to save beside a model)."""
        if self.modality == "text":
            name = type(self.tokenizer).__name__ if self.tokenizer is not None else None
            return {"modality": "text", "tokenizer": name, "max_length": self.max_length, "notes": self.notes}
        return {
            "modality": "image",
            "size": list(self.size) if self.size else None,
            "channels": self.channels,
            "mean": list(self.mean),
            "std": list(self.std),
            "rescale": self.rescale,
            "resize_to": self.resize_to,
            "resample": self.resample,
            "notes": self.notes,
        }

    def _geometry(self, image: PILImage.Image, resample: str) -> PILImage.Image:
        """``image`` resized (and centre-cropped) to :attr:`size` with the ``resample`` filter."""
        from PIL import Image

        # Pillow >= 9.1 names the filters in ``Image.Resampling`` (its type hints omit the module-level
        # aliases); older Pillow has the module-level constants only.
        filters: Any = getattr(Image, "Resampling", Image)
        chosen = {"bilinear": filters.BILINEAR, "bicubic": filters.BICUBIC, "nearest": filters.NEAREST}[resample]
        h, w = self.size if self.size is not None else (image.height, image.width)
        if self.resize_to is not None:
            scale = self.resize_to / min(image.width, image.height)
            image = image.resize((max(w, round(image.width * scale)), max(h, round(image.height * scale))), chosen)
            left, top = (image.width - w) // 2, (image.height - h) // 2
            return image.crop((left, top, left + w, top + h))
        return image.resize((w, h), chosen) if (image.height, image.width) != (h, w) else image

    def object_mask(self, image: PILImage.Image, threshold: float = 0.5) -> torch.Tensor:
        """``[H, W]`` bool: the pixels of a grey-level ``image`` brighter than ``threshold`` (a fraction
        of full brightness), placed like :meth:`image` places pixels (nearest resampling)."""
        grey = self._geometry(image.convert("L"), "nearest")
        return torch.from_numpy(np.asarray(grey, dtype=np.float32) / 255.0 > threshold)

    def image(self, image: PILImage.Image) -> torch.Tensor:
        """One PIL image → ``[C, H, W]`` float32."""
        image = self._geometry(image.convert("L" if self.channels == 1 else "RGB"), self.resample)
        h, w = image.height, image.width
        array = np.asarray(image, dtype=np.float32) * self.rescale
        x = torch.from_numpy(array.reshape(h, w, -1)).permute(2, 0, 1)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        return ((x - mean) / std).contiguous()


def _pair(value: Any) -> tuple[int, int]:
    """``N`` or ``[N]`` → ``(N, N)``; ``[H, W]`` (or ``[C, H, W]``) → ``(H, W)``."""
    if isinstance(value, (tuple, list)):
        return (int(value[0]), int(value[0])) if len(value) == 1 else (int(value[-2]), int(value[-1]))
    return int(value), int(value)


def _height_width(value: Any) -> tuple[int, int] | None:
    """``size`` / ``crop_size`` of a preprocessor config (int, ``[h, w]`` or ``{"height", "width"}``)."""
    if isinstance(value, dict):
        return (int(value["height"]), int(value["width"])) if "height" in value and "width" in value else None
    return _pair(value) if isinstance(value, (int, list, tuple)) else None


def _stats(name: str, value: Any, channels: int) -> tuple[float, ...]:
    """``value``: a number or per-channel numbers, from a flag or a preprocessor config."""
    values = tuple(float(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise PreprocessingError(f"image {name} {list(values)} must have 1 or {channels} values (one per channel)")
    if name == "std" and any(v <= 0 for v in values):
        raise PreprocessingError(f"image std {list(values)} must be > 0")
    return values


def _hf_image(directory: str, prep: Preprocessing) -> Preprocessing:
    """``preprocessor_config.json`` of a Hugging Face directory (its size when the model has none)."""
    path = os.path.join(directory, "preprocessor_config.json")
    if not os.path.isfile(path):
        return prep
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise PreprocessingError(f"cannot read {path}: {err}") from err
    size, crop = cfg.get("size"), cfg.get("crop_size")
    shortest = size.get("shortest_edge") if isinstance(size, dict) else None
    if shortest is not None:
        final = prep.size or _height_width(crop) or (int(shortest), int(shortest))
        resize_to = int(int(shortest) / float(cfg.get("crop_pct") or 1.0))
        prep = replace(prep, size=final, resize_to=resize_to if cfg.get("do_resize", True) else None)
    else:
        prep = replace(prep, size=prep.size or _height_width(size))
    if cfg.get("do_normalize", True):
        prep = replace(prep, mean=cfg.get("image_mean", prep.mean), std=cfg.get("image_std", prep.std))
    else:
        prep = replace(prep, mean=(0.0,), std=(1.0,))
    rescale = float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) else 1.0
    resample = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(cfg.get("resample", 2), "bilinear")
    return replace(prep, rescale=rescale, resample=resample)


def _timm_image(backbone: torch.nn.Module, prep: Preprocessing) -> Preprocessing:
    """timm's ``pretrained_cfg``: mean, std, interpolation, centre crop (``crop_pct``)."""
    cfg = getattr(backbone, "pretrained_cfg", None) or {}
    size = prep.size or (_pair(cfg["input_size"]) if "input_size" in cfg else None)
    crop_pct = float(cfg.get("crop_pct") or 1.0)
    resize_to = math.floor(min(size) / crop_pct) if size is not None and crop_pct < 1.0 else None
    resample = cfg.get("interpolation", "bilinear")
    return replace(
        prep,
        size=size,
        mean=cfg.get("mean", prep.mean),
        std=cfg.get("std", prep.std),
        resize_to=resize_to,
        resample=resample if resample in ("bilinear", "bicubic", "nearest") else "bilinear",
    )


def preprocessing_for(
    adapter: BackboneAdapter,
    source: Backbone,
    *,
    image_size: Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    max_length: int | None = None,
) -> Preprocessing:
    """The preprocessing of the backbone ``adapter`` wraps, read from its ``source`` (module docstring),
    with ``image_size`` / ``mean`` / ``std`` / ``max_length`` overriding it."""
    common: dict[str, Any] = {"label2id": adapter.label2id, "num_classes": adapter.num_classes}
    if adapter.modality == "text":
        return _text_preprocessing(adapter, source, max_length, common)
    channels = adapter.channels or 3
    fixed = adapter.image_size
    prep = Preprocessing("image", size=fixed, channels=channels, **common)
    if source.kind == "hf" and source.directory is not None:
        prep = _hf_image(source.directory, prep)
    elif source.kind == "timm":
        prep = _timm_image(source.model, prep)
    else:
        prep = replace(prep, mean=IMAGENET_MEAN, std=IMAGENET_STD, size=prep.size or (224, 224))
        prep.notes.append(f"a {source.kind} backbone carries no normalisation statistics: ImageNet's assumed")
    if image_size is not None:
        if len(image_size) not in (1, 2):
            raise PreprocessingError(f"--image-size takes N or H W, got {list(image_size)}")
        if fixed and tuple(_pair(list(image_size))) != tuple(fixed):
            raise PreprocessingError(
                f"--image-size {list(image_size)} differs from the backbone's input size {list(fixed)}"
            )
        prep = replace(prep, size=_pair(list(image_size)), resize_to=None)
    if prep.size is None:
        prep = replace(prep, size=(224, 224))
    prep = replace(prep, mean=_stats("mean", mean or prep.mean, channels), std=_stats("std", std or prep.std, channels))
    return prep


def _text_preprocessing(
    adapter: BackboneAdapter, source: Backbone, max_length: int | None, common: dict
) -> Preprocessing:
    directory = source.directory
    if directory is None:
        raise PreprocessingError(
            "text data needs the backbone's tokenizer: give --backbone as a Hugging Face directory"
        )
    from transformers import AutoTokenizer

    if not any(os.path.isfile(os.path.join(directory, f)) for f in TOKENIZER_FILES):
        raise PreprocessingError(
            f"no tokenizer in the backbone directory {directory} (none of {', '.join(TOKENIZER_FILES)}); "
            "save it there with tokenizer.save_pretrained"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as err:
        raise PreprocessingError(f"no tokenizer in the backbone directory {directory}: {err}") from err
    limit = adapter.max_tokens or 512
    return Preprocessing("text", tokenizer=tokenizer, max_length=min(max_length or 128, limit), **common)
