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

import html
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .adapters.images import upsample_mask
from .data.batches import parse_batch
from .model.output import SOPOutput

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
    device = kwargs.get("device") or next(sop.parameters()).device
    x = torch.as_tensor(inputs, dtype=torch.float32, device=device)
    target = None if targets is None else torch.as_tensor(targets, device=device).long().reshape(-1)
    return attribute(sop, x, target).cpu().numpy()


def used_groups(out: SOPOutput, example: int, cls: int) -> list[tuple[int, float]]:
    """``(group, weight c·λ·y)`` of the groups with a non-zero score for ``cls``, largest |weight| first."""
    scores = out.group_scores[example, cls]
    weights = out.attributions[example, cls]
    used = [(int(i), float(weights[i])) for i in torch.nonzero(scores > 0).flatten()]
    return sorted(used, key=lambda t: -abs(t[1]))


def _to_display(image: torch.Tensor):
    img = image.detach().float().cpu()
    img = (img - img.min()) / (img.max() - img.min()).clamp_min(1e-8)
    return img[0].numpy() if img.shape[0] == 1 else img.permute(1, 2, 0).numpy()


def explain_image(
    image: torch.Tensor,
    out: SOPOutput,
    example: int,
    grid: tuple[int, int],
    path: str,
    class_names: Sequence[str] | None = None,
    label: int | None = None,
    max_groups: int = 6,
) -> int:
    """Write a PNG: the input, each group the prediction uses (with ``c·λ·y``), the rest greyed.

    ``image [C, H, W]``; returns the number of panels drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pred = int(out.logits[example].argmax())
    groups = used_groups(out, example, pred)[:max_groups]
    shown = _to_display(image)
    size = (int(image.shape[-2]), int(image.shape[-1]))
    masks = upsample_mask(out.group_masks[example].view(-1, *grid), size).cpu()
    n_panels = 2 + len(groups)
    fig, axes = plt.subplots(1, n_panels, figsize=(2.2 * n_panels, 2.6), squeeze=False)
    name = (lambda c: class_names[c]) if class_names else str
    title = f"input\npred: {name(pred)}" + (f"\ntrue: {name(label)}" if label is not None else "")
    _panel(axes[0, 0], shown, None, title)
    for ax, (g, w) in zip(axes[0, 1:], groups):
        _panel(ax, shown, masks[g].numpy(), f"group {g}\nc·λ·y = {w:+.3f}", POSITIVE if w >= 0 else NEGATIVE)
    unused = torch.ones(out.group_masks.shape[1], dtype=torch.bool)
    unused[[g for g, _ in used_groups(out, example, pred)]] = False
    rest = masks[unused].any(dim=0).numpy() if bool(unused.any()) else None
    _panel(axes[0, -1], shown, rest, f"{int(unused.sum())} unused groups", UNUSED)
    n_used = len(used_groups(out, example, pred))
    fig.suptitle(
        f"SOP: logit {float(out.logits[example, pred]):.3f} = sum of c·λ·y over the {n_used} used groups "
        f"(top {len(groups)} shown)",
        fontsize=9,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return n_panels


POSITIVE = (0.1, 0.75, 0.2)
NEGATIVE = (0.9, 0.15, 0.15)
UNUSED = (0.55, 0.55, 0.55)


def _panel(ax, image, mask, title: str, colour: tuple[float, float, float] = POSITIVE) -> None:
    """The image in grey with ``mask`` tinted in ``colour``."""
    import numpy as np

    ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1)
    if mask is not None:
        overlay = np.zeros((*mask.shape, 4))
        overlay[..., :3] = colour
        overlay[..., 3] = mask * 0.55
        ax.imshow(overlay)
    ax.set_title(title, fontsize=8)
    ax.axis("off")


def explain_text(
    tokens: Sequence[str],
    out: SOPOutput,
    example: int,
    path: str,
    class_names: Sequence[str] | None = None,
    shown: Sequence[bool] | torch.Tensor | None = None,
) -> int:
    """Write a self-contained HTML page: one line per used group, its tokens highlighted with
    its weight ``c·λ·y``.  ``tokens`` are the example's ``T`` token strings; ``shown [T]`` (e.g.
    the attention mask) leaves out the tokens it marks false, such as padding; returns the
    number of highlighted spans."""
    keep = [True] * len(tokens) if shown is None else [bool(v) for v in shown]
    if len(keep) != len(tokens):
        raise ValueError(f"shown must have one entry per token ({len(tokens)}), got {len(keep)}")
    pred = int(out.logits[example].argmax())
    label = class_names[pred] if class_names else str(pred)
    rows, spans = [], 0
    for g, w in used_groups(out, example, pred):
        mask = out.group_masks[example, g]
        colour = "rgba(46,160,67,0.45)" if w >= 0 else "rgba(215,58,73,0.45)"
        words = []
        for t, tok in enumerate(tokens):
            if not keep[t]:
                continue
            text = html.escape(tok)
            if bool(mask[t]):
                spans += 1
                words.append(f'<span class="sop-group" data-group="{g}" style="background:{colour}">{text}</span>')
            else:
                words.append(f'<span class="sop-off">{text}</span>')
        rows.append(f"<p><b>group {g}</b> (c·λ·y = {w:+.3f}): {' '.join(words)}</p>")
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>SOP explanation</title>"
        "<style>body{font-family:sans-serif;max-width:60em}.sop-off{color:#999}span{padding:1px}</style>"
        f"</head><body><h2>Prediction: {html.escape(label)} "
        f"(logit {float(out.logits[example, pred]):.3f})</h2>{''.join(rows)}</body></html>"
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return spans


def write_explanations(
    model: SOP, dataset, out_dir: str, count: int, device: torch.device, class_names=None
) -> list[str]:
    """Explain the first ``count`` examples of ``dataset``: PNGs (images) or HTML pages (text).

    Each example is read by :func:`sopfast.data.batches.parse_batch` (as a batch of one), so any form
    it accepts works: ``(x, y)`` pairs, dicts with ``pixel_values`` / ``x`` / ``images``, or
    ``input_ids`` + ``attention_mask`` (a ``tokenizer`` attribute of ``dataset`` names the tokens).
    """
    model.eval().to(device)
    paths = []
    for i in range(min(count, len(dataset))):
        batch = parse_batch(torch.utils.data.default_collate([dataset[i]])).to(device)
        with torch.no_grad():
            out = model(**batch.model_inputs())
        labels = batch.labels
        label = int(labels[0]) if labels is not None and labels[0].numel() == 1 else None
        if batch.input_ids is not None:
            ids = batch.input_ids[0]
            tokenizer = getattr(dataset, "tokenizer", None)
            tokens = tokenizer.convert_ids_to_tokens(ids) if tokenizer else [str(t) for t in ids.tolist()]
            path = os.path.join(out_dir, f"text_{i}.html")
            shown = None if batch.attention_mask is None else batch.attention_mask[0]
            explain_text(tokens, out, 0, path, class_names or ("negative", "positive"), shown)
        else:
            grid = model.adapter.feature_grid(model.prepare(**batch.model_inputs()))
            if grid is None or batch.x is None:
                raise ValueError(
                    f"write_explanations draws images on a feature grid; {type(model.adapter).__name__} has none"
                )
            path = os.path.join(out_dir, f"image_{i}.png")
            explain_image(batch.x[0], out, 0, grid, path, class_names, label)
        paths.append(path)
    return paths
