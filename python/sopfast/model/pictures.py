"""Pictures of one SOP prediction: a PNG per image (:func:`explain_image`), a self-contained HTML
page per text (:func:`explain_text`); :meth:`sopfast.SOP.explain` draws a batch with them."""

from __future__ import annotations

import html
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..adapters.images import upsample_mask
from ..integrity import atomic_write_text, save_figure
from .output import SOPOutput


def image_grid(model: Any, images: torch.Tensor) -> tuple[int, int]:
    """The feature grid of ``model`` (a :class:`sopfast.SOP`) on ``images [B, C, H, W]`` (ValueError
    when its features lie on none: pictures draw groups on the image)."""
    grid = model.adapter.feature_grid(model.prepare(images))
    if grid is None:
        raise ValueError(f"pictures draw groups on a feature grid; {type(model.adapter).__name__} has none")
    return grid


def used_groups(out: SOPOutput, example: int, cls: int) -> list[tuple[int, float]]:
    """``(group, weight c·λ·y)`` of the groups with a non-zero score for ``cls``, largest |weight| first."""
    scores = out.group_scores[example, cls]
    weights = out.attributions[example, cls]
    used = [(int(i), float(weights[i])) for i in torch.nonzero(scores > 0).flatten()]
    return sorted(used, key=lambda t: -abs(t[1]))


@dataclass
class DistinctGroup:
    """Used groups with the same features, drawn once: the ``groups`` it stands for (the first names
    it) and their summed weight ``c·λ·y``."""

    groups: list[int]
    weight: float

    @property
    def first(self) -> int:
        return self.groups[0]

    def title(self) -> str:
        also = f" (×{len(self.groups)})" if len(self.groups) > 1 else ""
        return f"group {self.first}{also}"


def distinct_used_groups(out: SOPOutput, example: int, cls: int, min_share: float = 1e-3) -> list[DistinctGroup]:
    """The used groups of ``cls`` merged by identical masks, largest |summed weight| first; groups whose
    weight is negligible (``|c·λ·y|`` below ``min_share`` of the largest) are left out."""
    merged: dict[bytes, DistinctGroup] = {}
    masks = out.group_masks[example].cpu()
    for g, w in used_groups(out, example, cls):
        key = masks[g].numpy().tobytes()
        if key in merged:
            merged[key].groups.append(g)
            merged[key].weight += w
        else:
            merged[key] = DistinctGroup([g], w)
    largest = max((abs(d.weight) for d in merged.values()), default=0.0)
    kept = [d for d in merged.values() if abs(d.weight) >= min_share * largest and d.weight != 0.0]
    return sorted(kept, key=lambda d: -abs(d.weight))


LEGEND = (
    "green: a group that raises the predicted class (c·λ·y > 0); red: one that lowers it; grey: the groups "
    "the prediction does not use. c·λ·y = the selector's weight c × the generator's λ × the backbone's logit "
    "on the group alone; they add up to the logit. ×n: n groups with the same features."
)


def _to_display(image: torch.Tensor):
    img = image.detach().float().cpu()
    img = (img - img.min()) / (img.max() - img.min()).clamp_min(1e-8)
    return img[0].numpy() if img.shape[0] == 1 else img.permute(1, 2, 0).numpy()


def check_class_names(class_names: Sequence[str] | None, num_classes: int, label: int | None = None) -> None:
    """``class_names`` (if given) names every one of the ``num_classes`` classes; ``label`` is one of them."""
    if class_names is not None and (isinstance(class_names, str) or len(class_names) < num_classes):
        raise ValueError(f"class_names must name all {num_classes} classes, got {class_names!r}")
    if label is not None and not 0 <= label < num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes - 1}] (the model's classes), got {label}")


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
    """Write a PNG: the input, each distinct group the prediction uses (once, with how many groups it
    stands for and ``c·λ·y``), the unused groups greyed, and a legend in words.

    ``image [C, H, W]``; returns the number of panels drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    check_class_names(class_names, out.logits.shape[-1], label)
    pred = int(out.logits[example].argmax())
    distinct = distinct_used_groups(out, example, pred)
    shown_groups = distinct[:max_groups]
    shown = _to_display(image)
    size = (int(image.shape[-2]), int(image.shape[-1]))
    masks = upsample_mask(out.group_masks[example].view(-1, *grid), size).cpu()
    n_panels = 2 + len(shown_groups)
    fig, axes = plt.subplots(1, n_panels, figsize=(2.3 * max(n_panels, 4), 3.3), squeeze=False)
    name = (lambda c: class_names[c]) if class_names else str
    title = f"input\npred: {name(pred)}" + (f"\ntrue: {name(label)}" if label is not None else "")
    _panel(axes[0, 0], shown, None, title)
    for ax, group in zip(axes[0, 1:], shown_groups):
        colour = POSITIVE if group.weight >= 0 else NEGATIVE
        _panel(ax, shown, masks[group.first].numpy(), f"{group.title()}\nc·λ·y = {group.weight:+.3g}", colour)
    used = {g for d in distinct for g in d.groups} | {g for g, _ in used_groups(out, example, pred)}
    unused = torch.ones(out.group_masks.shape[1], dtype=torch.bool)
    unused[sorted(used)] = False
    rest = masks[unused].any(dim=0).numpy() if bool(unused.any()) else None
    _panel(axes[0, -1], shown, rest, f"{int(unused.sum())} unused groups", UNUSED)
    for ax in axes[0, n_panels:]:
        ax.axis("off")
    fig.suptitle(
        f"SOP: logit {float(out.logits[example, pred]):.3f} = sum of c·λ·y over {len(used)} used groups "
        f"({len(distinct)} distinct, top {len(shown_groups)} shown)",
        fontsize=9,
    )
    fig.text(0.5, 0.02, "\n".join(textwrap.wrap(LEGEND, 150)), ha="center", va="bottom", fontsize=7, color="#333")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(fig, path, dpi=110)
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


def _group_words(tokens: Sequence[str], keep: Sequence[bool], mask: torch.Tensor) -> str:
    """The group's tokens in order, word pieces (``##…``) joined to the token before them when both are in."""
    words: list[str] = []
    previous = -2
    for t, tok in enumerate(tokens):
        if not (keep[t] and bool(mask[t])):
            continue
        if tok.startswith("##") and previous == t - 1 and words:
            words[-1] += tok[2:]
        else:
            words.append(tok.lstrip("Ġ▁"))
        previous = t
    return ", ".join(html.escape(w) for w in words)


def _class_name(class_names: Sequence[str] | None, c: int) -> str:
    return class_names[c] if class_names and c < len(class_names) else str(c)


def explain_text(
    tokens: Sequence[str],
    out: SOPOutput,
    example: int,
    path: str,
    class_names: Sequence[str] | None = None,
    shown: Sequence[bool] | torch.Tensor | None = None,
    label: int | None = None,
) -> int:
    """Write a self-contained HTML page: the text, then one line per distinct used group (with how many
    groups it stands for): its words, what the backbone predicts from them alone, the selector's weight
    ``c``, the contribution ``c·λ·y`` to the predicted class, and the text with its tokens highlighted;
    then the groups the prediction does not use, with their words; and a legend.  Used groups whose
    weight rounds to zero are left out.  ``tokens`` are the example's ``T`` token strings; ``shown [T]``
    (e.g. the attention mask) leaves out the tokens it marks false, such as padding; ``label`` adds the
    true class.  Returns the number of highlighted spans."""
    keep = [True] * len(tokens) if shown is None else [bool(v) for v in shown]
    if len(keep) != len(tokens):
        raise ValueError(f"shown must have one entry per token ({len(tokens)}), got {len(keep)}")
    check_class_names(class_names, out.logits.shape[-1])
    pred = int(out.logits[example].argmax())
    probs = out.group_logits[example].float().softmax(-1)
    rows, spans = [], 0
    used = distinct_used_groups(out, example, pred)
    for group in used:
        mask = out.group_masks[example, group.first]
        colour = "rgba(46,160,67,0.45)" if group.weight >= 0 else "rgba(215,58,73,0.45)"
        marked = []
        for t, tok in enumerate(tokens):
            if not keep[t]:
                continue
            text = html.escape(tok)
            if bool(mask[t]):
                spans += 1
                marked.append(
                    f'<span class="sop-group" data-group="{group.first}" style="background:{colour}">{text}</span>'
                )
            else:
                marked.append(f'<span class="sop-off">{text}</span>')
        alone = int(probs[group.first].argmax())
        weight = float(out.group_scores[example, pred, group.groups].sum())
        rows.append(
            f"<p><b>{group.title()}</b> (c·λ·y = {group.weight:+.3g}): <b>{_group_words(tokens, keep, mask)}</b><br>"
            f"<span class='sop-note'>alone: {html.escape(_class_name(class_names, alone))} "
            f"({float(probs[group.first, alone]):.0%}); selector weight c = {weight:.3g}</span><br>"
            f"{' '.join(marked)}</p>"
        )
    drawn = {g for d in used for g in d.groups}
    unused, seen = [], set()
    for g in range(out.group_masks.shape[1]):
        words = _group_words(tokens, keep, out.group_masks[example, g])
        if g in drawn or words in seen:
            continue
        seen.add(words)
        alone = int(probs[g].argmax())
        unused.append(
            f"<li>group {g}: {words} <span class='sop-note'>(alone: "
            f"{html.escape(_class_name(class_names, alone))}, {float(probs[g, alone]):.0%})</span></li>"
        )
    text = " ".join(html.escape(tok) for t, tok in enumerate(tokens) if keep[t])
    truth = "" if label is None else f"; true class: {html.escape(_class_name(class_names, label))}"
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>SOP explanation</title>"
        "<style>body{font-family:sans-serif;max-width:60em}.sop-off{color:#999}span{padding:1px}"
        ".legend,.sop-note{color:#555;font-size:90%}</style>"
        f"</head><body><h2>Prediction: {html.escape(_class_name(class_names, pred))} "
        f"(logit {float(out.logits[example, pred]):.3f}){truth}</h2><p>{text}</p>"
        f"<h3>The groups the prediction uses</h3>{''.join(rows)}"
        + (f"<h3>Groups not used</h3><ul>{''.join(unused)}</ul>" if unused else "")
        + f"<p class='legend'>{html.escape(LEGEND.replace('grey: the groups the prediction does not use. ', ''))} "
        "alone: the backbone's prediction from the group's words only.</p></body></html>"
    )
    atomic_write_text(path, page)
    return spans


def explain_batch(
    model: Any,
    x: torch.Tensor,
    out_dir: str | os.PathLike,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    class_names: Sequence[str] | None = None,
    labels: torch.Tensor | None = None,
    tokens: Sequence[Sequence[str]] | None = None,
) -> list[str]:
    """:meth:`sopfast.SOP.explain`: one picture per example of ``model``'s predictions on a batch, written in
    ``out_dir`` (a PNG per image, an HTML page per text); returns the paths."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x, attention_mask, token_type_ids)
    finally:
        model.train(was_training)
    paths = []
    for i in range(out.logits.shape[0]):
        label = None if labels is None else int(labels[i])
        if model.adapter.modality == "text":
            words = list(tokens[i]) if tokens is not None else [str(t) for t in x[i].tolist()]
            path = os.path.join(os.fspath(out_dir), f"text_{i:04d}.html")
            shown = None if attention_mask is None else attention_mask[i]
            explain_text(words, out, i, path, class_names, shown, label)
        else:
            path = os.path.join(os.fspath(out_dir), f"image_{i:04d}.png")
            explain_image(x[i], out, i, image_grid(model, x[i : i + 1]), path, class_names, label)
        paths.append(path)
    return paths
