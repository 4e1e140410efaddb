"""How raw examples become a backbone's inputs, done by the library the backbone came from.

Images: a Hugging Face directory's own image processor (``AutoImageProcessor``); timm's eval
transform (``timm.data.create_transform`` of the model's ``pretrained_cfg``); for a backbone that
carries no preprocessing (torchvision, a pickled module, an HF directory without
``preprocessor_config.json``) torchvision transforms with the adapter's input size and ImageNet's
(or ViT's 0.5) statistics, said in ``notes``.  Flags override size, mean and std.  Text: the
directory's tokenizer.

A model trained on these inputs saves the preprocessing's description
(:meth:`Preprocessing.describe`, in its ``provenance``); given as ``saved``, its size, mean, std
and text length apply again wherever they differ from the backbone's own and no flag overrides them
(an override that differs is logged as a warning).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from ..defaults import MAX_LENGTH
from .base import BackboneAdapter
from .sources import Backbone

if TYPE_CHECKING:
    from PIL import Image as PILImage

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RESAMPLE_NAMES = {0: "nearest", 2: "bilinear", 3: "bicubic"}
#: what a saved preprocessing record holds for each override of :func:`preprocessing_for`, and its flag
SAVED_FIELDS = {"image_size": ("size", "--image-size"), "mean": ("mean", "--image-mean"), "std": ("std", "--image-std")}
logger = logging.getLogger(__name__)


class PreprocessingError(ValueError):
    """A preprocessing that cannot be built as asked (a missing tokenizer, bad statistics, a size the
    backbone does not take): the message names the file or flag."""


@dataclass
class Preprocessing:
    """How raw examples become model inputs.

    Images: ``transform`` (PIL image → ``[C, H, W]`` float32) from ``library``; ``size``, ``mean``,
    ``std``, ``resize_to`` (shorter side before the centre crop) and ``resample`` describe it;
    ``mask_transform`` places pixels the same way with nearest resampling and no normalisation
    (→ ``[C, H, W]`` in [0, 1]).  Text: ``tokenizer`` with ``max_length`` tokens.
    """

    modality: str
    size: tuple[int, int] | None = None
    channels: int = 3
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    resize_to: int | None = None
    resample: str = "bilinear"
    library: str = ""
    transform: Callable[[Any], torch.Tensor] | None = field(default=None, repr=False)
    #: ``transform`` of a list of images at once (``[B, C, H, W]``), where the library batches them
    batch_transform: Callable[[list[Any]], torch.Tensor] | None = field(default=None, repr=False)
    mask_transform: Callable[[Any], torch.Tensor] | None = field(default=None, repr=False)
    tokenizer: Any = None
    max_length: int = MAX_LENGTH
    label2id: dict[str, int] = field(default_factory=dict)
    num_classes: int | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """What this preprocessing does, in plain values (to print and to save beside a model)."""
        if self.modality == "text":
            name = type(self.tokenizer).__name__ if self.tokenizer is not None else None
            return {"modality": "text", "tokenizer": name, "max_length": self.max_length, "notes": self.notes}
        keys = ("library", "size", "channels", "mean", "std", "resize_to", "resample", "notes")
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in ((k, getattr(self, k)) for k in keys)}
        return {"modality": "image", **values}

    def _mode(self, image: PILImage.Image) -> PILImage.Image:
        return image.convert("L" if self.channels == 1 else "RGB")

    def image(self, image: PILImage.Image) -> torch.Tensor:
        """One PIL image → ``[C, H, W]`` float32."""
        assert self.transform is not None, "an image preprocessing has a transform"
        return self.transform(self._mode(image)).float().contiguous()

    def batch(self, items: Any, pairs: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Raw examples as the model's keyword inputs: images (PIL images or paths, one or a list) →
        ``{"pixel_values": [B, C, H, W]}``; texts (one or a list, with second segments ``pairs``) →
        ``input_ids``, ``attention_mask`` and ``token_type_ids`` ``[B, T]``, padded to the longest."""
        single = isinstance(items, (str, os.PathLike)) or not isinstance(items, (list, tuple))
        items = [items] if single else list(items)
        if self.modality == "text":
            if self.tokenizer is None:
                raise PreprocessingError("text inputs need the backbone's tokenizer, which this model does not record")
            if not all(isinstance(t, str) for t in items):
                raise PreprocessingError(f"a text model takes strings, got {type(items[0]).__name__}")
            enc = self.tokenizer(
                items,
                None if pairs is None else ([pairs] if isinstance(pairs, str) else list(pairs)),
                padding="longest",
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            ids = enc["input_ids"]
            types = enc.get("token_type_ids", torch.zeros_like(ids))
            return {"input_ids": ids, "attention_mask": enc["attention_mask"], "token_type_ids": types}
        from PIL import Image

        images = [Image.open(i) if isinstance(i, (str, os.PathLike)) else i for i in items]
        bad = next((type(i).__name__ for i in images if not isinstance(i, Image.Image)), None)
        if bad is not None:
            raise PreprocessingError(f"an image model takes PIL images or image paths, got {bad}")
        return {"pixel_values": torch.stack([self.image(image) for image in images])}

    def images(self, images: list[PILImage.Image]) -> torch.Tensor:
        """PIL images → ``[B, C, H, W]`` float32, equal to :meth:`image` of each (one call where the
        library batches: a Hugging Face image processor spends ~4× less per image)."""
        if self.batch_transform is None:
            return torch.stack([self.image(image) for image in images])
        return self.batch_transform([self._mode(image) for image in images]).float().contiguous()

    def object_mask(self, image: PILImage.Image, threshold: float = 0.5) -> torch.Tensor:
        """``[H, W]`` bool: the pixels of a grey-level ``image`` brighter than ``threshold`` (a fraction
        of full brightness), placed like :meth:`image` places pixels."""
        assert self.mask_transform is not None, "an image preprocessing has a mask transform"
        return self.mask_transform(self._mode(image.convert("L")))[0] > threshold


def _pair(value: Any) -> tuple[int, int]:
    """``N`` or ``[N]`` → ``(N, N)``; ``[H, W]`` (or ``[C, H, W]``) → ``(H, W)``."""
    if isinstance(value, (tuple, list)):
        return (int(value[0]), int(value[0])) if len(value) == 1 else (int(value[-2]), int(value[-1]))
    return int(value), int(value)


def _stats(name: str, value: Any, channels: int) -> tuple[float, ...]:
    """``value``: a number or per-channel numbers, from a flag or the backbone's config."""
    values = tuple(float(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise PreprocessingError(f"image {name} {list(values)} must have 1 or {channels} values (one per channel)")
    if name == "std" and any(v <= 0 for v in values):
        raise PreprocessingError(f"image std {list(values)} must be > 0")
    return values


def _hf_call(processor: Any, options: dict[str, Any], image: PILImage.Image) -> torch.Tensor:
    return processor(images=image, return_tensors="pt", **options)["pixel_values"][0]


def _hf_batch(processor: Any, options: dict[str, Any], images: list[PILImage.Image]) -> torch.Tensor:
    return processor(images=images, return_tensors="pt", **options)["pixel_values"]


def _hf_image(
    directory: str, prep: Preprocessing, size: tuple[int, int] | None, stats: dict[str, tuple[float, ...]]
) -> Preprocessing | None:
    """The directory's ``AutoImageProcessor`` (``None`` when it has no ``preprocessor_config.json``),
    with the ``stats`` given (``mean`` / ``std``) in place of its own."""
    if not os.path.isfile(os.path.join(directory, "preprocessor_config.json")):
        return None
    from transformers import AutoImageProcessor
    from transformers.image_utils import PILImageResampling

    try:
        processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as err:
        raise PreprocessingError(f"cannot read the image processor in {directory}: {err}") from err
    options: dict[str, Any] = {f"image_{k}": list(v) for k, v in stats.items()}
    if size is not None and "height" in (processor.size or {}):
        options["size"] = {"height": size[0], "width": size[1]}
    elif size is not None:
        options.update(size={"shortest_edge": min(size)}, crop_size={"height": size[0], "width": size[1]})
    normalize = getattr(processor, "do_normalize", True)
    mean = stats.get("mean", tuple(processor.image_mean) if normalize else (0.0,) * prep.channels)
    std = stats.get("std", tuple(processor.image_std) if normalize else (1.0,) * prep.channels)
    mask = {**options, "do_normalize": False, "resample": PILImageResampling.NEAREST}
    return replace(
        prep,
        mean=mean,
        std=std,
        library=f"transformers {type(processor).__name__}",
        size=size or _output_size(partial(_hf_call, processor, options)),
        resample=RESAMPLE_NAMES.get(int(getattr(processor, "resample", 2) or 2), "bilinear"),
        transform=partial(_hf_call, processor, options),
        batch_transform=partial(_hf_batch, processor, options),
        mask_transform=partial(_hf_call, processor, mask),
    )


def _output_size(transform: Callable[[Any], torch.Tensor]) -> tuple[int, int]:
    """The ``(H, W)`` that ``transform`` makes of an image (a processor sizes by its own config)."""
    from PIL import Image

    return tuple(transform(Image.new("RGB", (67, 61))).shape[-2:])  # type: ignore[return-value]


def _timm_image(
    backbone: torch.nn.Module, prep: Preprocessing, size: tuple[int, int] | None, stats: dict[str, tuple[float, ...]]
) -> Preprocessing:
    """timm's eval transform of the model's ``pretrained_cfg`` (mean, std, interpolation, crop), with
    the ``stats`` given (``mean`` / ``std``) in place of its own."""
    import timm.data

    config = {**timm.data.resolve_data_config({}, model=backbone), **stats}
    notes = list(prep.notes)
    for name in ("mean", "std"):  # a model built with other in_chans keeps its pretrained_cfg's statistics
        values = tuple(float(v) for v in config[name])
        if len(values) != prep.channels and name not in stats:
            config[name] = (sum(values) / len(values),) * prep.channels
            notes.append(f"timm's {len(values)}-channel {name} averaged for the model's {prep.channels} channel(s)")
    config["input_size"] = (prep.channels, *(size or _pair(config["input_size"])))
    size = _pair(config["input_size"])
    crop_pct = float(config.get("crop_pct") or 1.0)
    masks = {**config, "interpolation": "nearest", "mean": (0.0,) * prep.channels, "std": (1.0,) * prep.channels}
    return replace(
        prep,
        notes=notes,
        library="timm create_transform",
        mean=tuple(config["mean"]),
        std=tuple(config["std"]),
        size=size,
        resize_to=math.floor(min(size) / crop_pct) if crop_pct < 1.0 else None,
        resample=str(config.get("interpolation", "bilinear")),
        transform=timm.data.create_transform(**config),
        mask_transform=timm.data.create_transform(**masks),
    )


def _torchvision_image(prep: Preprocessing, size: tuple[int, int]) -> Preprocessing:
    """Resize to ``size``, to tensor, normalise with ``prep.mean`` / ``prep.std``: for backbones that
    carry no preprocessing."""
    from torchvision import transforms

    nearest = transforms.InterpolationMode.NEAREST
    normalize = transforms.Normalize(prep.mean, prep.std)
    return replace(
        prep,
        library="torchvision transforms",
        size=size,
        transform=transforms.Compose([transforms.Resize(size), transforms.ToTensor(), normalize]),
        mask_transform=transforms.Compose([transforms.Resize(size, interpolation=nearest), transforms.ToTensor()]),
    )


def preprocessing_for(
    adapter: BackboneAdapter,
    source: Backbone,
    *,
    image_size: Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    max_length: int | None = None,
    saved: dict[str, Any] | None = None,
) -> Preprocessing:
    """The preprocessing of the backbone ``adapter`` wraps, read from its ``source`` (module docstring),
    with ``image_size`` / ``mean`` / ``std`` / ``max_length`` overriding it; ``saved``: the record a model
    was trained with (:meth:`Preprocessing.describe`), which applies where no override is given."""
    given: dict[str, Any] = {"image_size": image_size, "mean": mean, "std": std, "max_length": max_length}
    prep = _backbone_preprocessing(adapter, source, **given)
    if not saved or saved.get("modality") != prep.modality:
        return prep
    if prep.modality == "text":
        fields = {"max_length": ("max_length", "--max-length")}
        own: dict[str, Any] = {"max_length": prep.max_length}
    else:
        fields = dict(SAVED_FIELDS)
        own = {"image_size": list(prep.size or ()), "mean": list(prep.mean), "std": list(prep.std)}
        if adapter.image_size is not None:
            fields.pop("image_size")  # fixed by the backbone
    taken = {}
    for name, (key, flag) in fields.items():
        value = saved.get(key)
        if value is None or value == own[name]:
            continue
        if given[name] is None:
            taken[name] = value
        else:
            logger.warning("%s %s overrides the model's saved %s %s", flag, own[name], key, value)
    if not taken:
        return prep
    prep = _backbone_preprocessing(adapter, source, **{**given, **taken})
    shown = ", ".join(f"{fields[name][0]} {value} (the backbone's own: {own[name]})" for name, value in taken.items())
    prep.notes.append(f"as the model was trained: {shown}")
    return prep


def _backbone_preprocessing(
    adapter: BackboneAdapter,
    source: Backbone,
    *,
    image_size: Sequence[int] | None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    max_length: int | None,
) -> Preprocessing:
    """:func:`preprocessing_for` without a saved record."""
    common: dict[str, Any] = {"label2id": adapter.label2id, "num_classes": adapter.num_classes}
    if adapter.modality == "text":
        return _text_preprocessing(adapter, source, max_length, common)
    channels = adapter.channels or 3
    fixed = adapter.image_size
    size = fixed
    if image_size is not None:
        if len(image_size) not in (1, 2):
            raise PreprocessingError(f"--image-size takes N or H W, got {list(image_size)}")
        if fixed and tuple(_pair(list(image_size))) != tuple(fixed):
            raise PreprocessingError(
                f"--image-size {list(image_size)} differs from the backbone's input size {list(fixed)}"
            )
        size = _pair(list(image_size))
    stats = {k: _stats(k, v, channels) for k, v in (("mean", mean), ("std", std)) if v is not None}
    prep = Preprocessing("image", channels=channels, **common)
    built = None
    if source.kind == "hf" and source.directory is not None:
        built = _hf_image(source.directory, prep, size, stats)
    elif source.kind == "timm":
        built = _timm_image(source.model, prep, size, stats)
    if built is None:  # the backbone carries no preprocessing
        hf = source.kind == "hf"
        assumed = {"mean": (0.5,) if hf else IMAGENET_MEAN, "std": (0.5,) if hf else IMAGENET_STD}
        if len(stats) < 2:
            prep.notes.append(f"the backbone states no normalisation: {'0.5' if hf else 'ImageNet'} mean/std assumed")
        stats = {k: stats.get(k, _stats(k, assumed[k], channels)) for k in ("mean", "std")}
        built = _torchvision_image(replace(prep, mean=stats["mean"], std=stats["std"]), size or (224, 224))
    return _checked(built)


def _checked(prep: Preprocessing) -> Preprocessing:
    """``prep``, once a blank image comes out at its stated size with its channels."""
    from PIL import Image

    shape = tuple(prep.image(Image.new("RGB", (prep.size[1] + 3, prep.size[0] + 5))).shape) if prep.size else ()
    if shape != (prep.channels, *(prep.size or ())):
        raise PreprocessingError(
            f"the backbone's image preprocessing ({prep.library}) makes {list(shape)} images, not the "
            f"{[prep.channels, *(prep.size or ())]} the backbone takes; set --image-size, --image-mean, --image-std"
        )
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
    return Preprocessing("text", tokenizer=tokenizer, max_length=min(max_length or MAX_LENGTH, limit), **common)
