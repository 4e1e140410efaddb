"""SOP explanations for people and for tools.

* Pictures: a PNG per image (:func:`explain_image`), a self-contained HTML page per text
  (:func:`explain_text`).
* Maps shaped like the input, for the attribution tools people already use:
  :func:`to_input_space` lifts per-feature attributions (:meth:`SOPOutput.feature_attributions`,
  ``[B, d]``) to ``[B, C, H, W]`` images or ``[B, T]`` tokens; :func:`attribute` does both steps;
  :class:`SOPAttribution` is a Captum-style ``attribute(inputs, target=...)`` object;
  :func:`quantus_explain_func` is an ``explain_func`` for Quantus metrics, which evaluate
  :class:`SOPClassifier` (the SOP model as a plain ``x → logits`` module).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .adapters.images import upsample_mask
from .data.batches import parse_batch
from .devices import module_device
from .model.pictures import explain_image, explain_text, image_grid

if TYPE_CHECKING:
    import numpy as np

    from .model.sop import SOP

Target = int | Sequence[int] | torch.Tensor | None


def to_input_space(model: SOP, feature_attributions: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Per-feature attributions ``[B, d]`` as a map shaped like the model input.

    Images ``inputs [B, C, H, W]``: each pixel gets the value of the feature (patch / CNN cell) it
    lies in (nearest upsampling of the feature grid, the rule SOP masks pixels with), repeated over
    the ``C`` channels → ``[B, C, H, W]``.  Text ``inputs [B, T]`` (token ids): the features are the
    tokens → ``[B, T]``.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() not in (2, 4):
        shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise ValueError(f"inputs must be images [B, C, H, W] or token ids [B, T], got {shape}")
    b = inputs.shape[0]
    if model.adapter.modality == "text":
        if tuple(feature_attributions.shape) != tuple(inputs.shape[:2]):
            raise ValueError(
                f"feature_attributions {tuple(feature_attributions.shape)} must be [B, T] = {tuple(inputs.shape[:2])}"
            )
        return feature_attributions
    grid = model.adapter.feature_grid(model.prepare(inputs))
    if grid is None or inputs.dim() != 4:
        raise ValueError(f"{type(model.adapter).__name__} has no feature grid to map onto images [B, C, H, W]")
    if tuple(feature_attributions.shape) != (b, grid[0] * grid[1]):
        raise ValueError(
            f"feature_attributions {tuple(feature_attributions.shape)} must be [B, d] = {(b, grid[0] * grid[1])}"
        )
    pixels = upsample_mask(feature_attributions.reshape(b, *grid), (int(inputs.shape[-2]), int(inputs.shape[-1])))
    return pixels.unsqueeze(1).expand(-1, inputs.shape[1], -1, -1).contiguous()


def attribute(
    model: SOP,
    inputs: torch.Tensor,
    target: Target = None,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """SOP's attributions for ``target`` (class id(s); ``None``: the prediction), shaped like ``inputs``.

    One forward without autograd, then :meth:`SOPOutput.feature_attributions` and
    :func:`to_input_space`: ``[B, C, H, W]`` for images, ``[B, T]`` for token ids (give
    ``attention_mask`` and optionally ``token_type_ids`` for text).
    """
    with torch.no_grad():
        out = model(inputs, attention_mask, token_type_ids)
    return to_input_space(model, out.feature_attributions(target), inputs).float()


class SOPAttribution:
    """Captum-style attribution object: ``SOPAttribution(model).attribute(inputs, target=...)``.

    ``inputs`` a tensor (or a 1-tuple, as Captum allows); for text pass
    ``additional_forward_args=(attention_mask, token_type_ids)``.  Returns attributions shaped like
    ``inputs`` (a tuple when a tuple came in).  SOP's attributions are exact by construction, so
    there is no convergence delta.
    """

    def __init__(self, model: SOP):
        self.forward_func = model

    def has_convergence_delta(self) -> bool:
        return False

    def attribute(
        self, inputs: torch.Tensor | tuple[torch.Tensor], target: Target = None, additional_forward_args: Any = None
    ) -> torch.Tensor | tuple[torch.Tensor]:
        if isinstance(inputs, tuple):
            if len(inputs) != 1:
                raise ValueError(f"SOPAttribution takes one input tensor, got a tuple of {len(inputs)}")
            x = inputs[0]
        else:
            x = inputs
        extra = additional_forward_args
        extra = () if extra is None else (tuple(extra) if isinstance(extra, (tuple, list)) else (extra,))
        result = attribute(self.forward_func, x, target, *extra)
        return (result,) if isinstance(inputs, tuple) else result


class SOPClassifier(nn.Module):
    """The SOP model as a plain classifier, ``forward(x, attention_mask=None, token_type_ids=None) → logits [B, C]``:
    what Quantus metrics and Captum baselines call."""

    def __init__(self, model: SOP):
        super().__init__()
        self.sop = model

    def forward(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.sop(x, attention_mask, token_type_ids).logits


def quantus_explain_func(model: nn.Module, inputs: Any, targets: Any, **kwargs: Any) -> np.ndarray:
    """An ``explain_func`` for Quantus metrics: SOP's attributions as a numpy array shaped like ``inputs``.

    ``model`` is the :class:`SOPClassifier` Quantus evaluates (or the SOP model itself), ``inputs``
    the image batch ``[B, C, H, W]`` (numpy or tensor), ``targets`` class ids ``[B]``; ``device``
    in ``kwargs`` is honoured, other keys are ignored.
    """
    from .model.sop import SOP

    sop = model.sop if isinstance(model, SOPClassifier) else model
    if not isinstance(sop, SOP):
        raise TypeError(f"model must be a SOPClassifier or a sopfast.SOP model, got {type(model).__name__}")
    device = kwargs.get("device") or module_device(sop)
    x = torch.as_tensor(inputs, dtype=torch.float32, device=device)
    target = None if targets is None else torch.as_tensor(targets, device=device).long().reshape(-1)
    return attribute(sop, x, target).cpu().numpy()


def example_name(dataset: Any, index: int, label: int | None, class_names: Sequence[str] | None) -> str:
    """A file-name part naming example ``index``: its source file's stem (datasets with ``sources``,
    e.g. image folders), else its true class; letters, digits, ``-`` and ``_`` only."""
    sources = getattr(dataset, "sources", None)
    source = sources[index] if sources is not None and index < len(sources) else None
    if isinstance(source, dict):  # an undecoded datasets.Image
        source = source.get("path")
    if isinstance(source, (str, os.PathLike)):
        stem = os.path.splitext(os.path.basename(os.fspath(source)))[0]
    elif label is not None:
        stem = class_names[label] if class_names and label < len(class_names) else f"class{label}"
    else:
        stem = ""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-")[:40]
    return f"{index:04d}" + (f"_{stem}" if stem else "")


def write_explanations(
    model: SOP,
    dataset: Any,
    out_dir: str,
    count: int,
    device: torch.device,
    class_names: Sequence[str] | None = None,
    progress: bool = True,
) -> list[str]:
    """Explain the first ``count`` examples of ``dataset``: PNGs (images) or HTML pages (text), named
    after the example (:func:`example_name`: its source file, or its class).

    Args:
        progress: show a progress bar over the examples.

    Each example is read by :func:`sopfast.data.batches.parse_batch` (as a batch of one), so any form
    it accepts works: ``(x, y)`` pairs, dicts with ``pixel_values`` / ``x`` / ``images``, or
    ``input_ids`` + ``attention_mask`` (a ``tokenizer`` attribute of ``dataset`` names the tokens).
    """
    model.eval().to(device)
    paths = []
    for i in tqdm(range(min(count, len(dataset))), desc="sopfast explain", disable=not progress):
        batch = parse_batch(torch.utils.data.default_collate([dataset[i]])).to(device)
        with torch.no_grad():
            out = model(**batch.model_inputs())
        labels = batch.labels
        label = int(labels[0]) if labels is not None and labels[0].numel() == 1 else None
        name = example_name(dataset, i, label, class_names)
        if batch.input_ids is not None:
            ids = batch.input_ids[0]
            tokenizer = getattr(dataset, "tokenizer", None)
            tokens = tokenizer.convert_ids_to_tokens(ids) if tokenizer else [str(t) for t in ids.tolist()]
            path = os.path.join(out_dir, f"text_{name}.html")
            shown = None if batch.attention_mask is None else batch.attention_mask[0]
            explain_text(tokens, out, 0, path, class_names or ("negative", "positive"), shown, label)
        else:
            if batch.x is None:
                raise ValueError("write_explanations draws images or texts; this example is neither")
            path = os.path.join(out_dir, f"image_{name}.png")
            explain_image(batch.x[0], out, 0, image_grid(model, batch.x), path, class_names, label)
        paths.append(path)
    return paths
