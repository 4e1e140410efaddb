"""Captum's perturbation explainers on sopfast's drop path vs Captum on the plain Hugging Face model.

Same explainer, same ``n_samples`` / window, same ``perturbations_per_eval``, randomly initialised
ViT-B/16 at 224 px (batch 4, 196 patch features) and BERT-base at 512 tokens (batch 2, 510 token
features).  Plain: Captum on ``pixel_values`` with a patch ``feature_mask`` (ablated patches are 0)
or on BERT's input embeddings with a token ``feature_mask`` (ablated tokens are the [PAD]
embedding) — every sample a full-length pass.  sopfast: :class:`sopfast.MaskedForward` in ``drop``
mode — every sample runs only its kept tokens.  The two alternate (plain, sopfast, plain, …) and
the table gives the ratio of their median times, with the ratio of transformer FLOPs the sampled
masks allow (``ideal``: the work of the full passes over the work of the kept tokens, per layer
``24·t·E² + 4·t²·E`` for ``t`` tokens).  A last row runs RISE with sparse masks (20 % of the
patches kept) on ViT-B/16 — the plain model on images with the other patches zeroed vs
:func:`sopfast.rise` in ``drop`` mode — where dropping tokens pays most.

    OMP_NUM_THREADS=1 python bench/captum_speed.py --out bench/RESULTS_masking.md   # about 25 min
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import sopfast
from sopfast import testing

CASES = {
    # name: (model kind, explainer, attribute kwargs)
    "KernelShap": ("KernelShap", {"n_samples": 48}),
    "Occlusion": ("Occlusion", {}),
    "Lime": ("Lime", {"n_samples": 48}),
}
PER_EVAL = 16


def _flops(tokens: torch.Tensor, width: int) -> float:
    t = tokens.double()
    return float((24 * t * width**2 + 4 * t**2 * width).sum())


class _Recorder:
    """Wraps a MaskedForward and records how many features every row it runs keeps."""

    def __init__(self, forward: sopfast.MaskedForward):
        self.forward, self.kept = forward, []

    def __call__(self, presence: torch.Tensor, example: torch.Tensor) -> torch.Tensor:
        self.kept.append((presence > 0.5).sum(1))
        return self.forward(presence, example)


def _vit_case(explainer: str, kwargs: dict) -> tuple[Callable, Callable, int, int, int, _Recorder]:
    """(plain, sopfast, width E, features d, prefix tokens, recorder) for ViT-B/16."""
    import captum.attr as ca

    vit = testing.vit("b16", num_labels=10)
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    target = torch.arange(4)
    ids = torch.arange(196).view(14, 14).repeat_interleave(16, 0).repeat_interleave(16, 1)
    mask = ids.expand(1, 3, 224, 224).contiguous()
    window_plain = {"sliding_window_shapes": (3, 32, 32), "strides": (3, 32, 32)}
    ours = sopfast.MaskedForward(vit, x, mode="drop")
    recorder = _Recorder(ours)
    grid_ids = torch.arange(196).view(14, 14)
    pair_ids = ((grid_ids // 14) // 2 * 7 + (grid_ids % 14) // 2).view(1, 196)  # 2×2 patch windows

    def plain():
        method = getattr(ca, explainer)(lambda p: vit(pixel_values=p).logits)
        extra = window_plain if explainer == "Occlusion" else {"feature_mask": mask, **kwargs}
        with torch.no_grad():
            return method.attribute(x, baselines=0.0, target=target, perturbations_per_eval=PER_EVAL, **extra)

    def fast():
        # Occlusion of 2×2-patch windows = ablation of those windows as features
        method = getattr(ca, "FeatureAblation" if explainer == "Occlusion" else explainer)(recorder)
        extra = {"feature_mask": pair_ids} if explainer == "Occlusion" else kwargs
        return method.attribute(
            ours.presence,
            target=target,
            additional_forward_args=ours.example_ids,
            perturbations_per_eval=PER_EVAL,
            **extra,
        )

    return plain, fast, 768, 196, 1, recorder


def _bert_case(explainer: str, kwargs: dict) -> tuple[Callable, Callable, int, int, int, _Recorder]:
    """(plain, sopfast, width E, features d, prefix tokens, recorder) for BERT-base at 512 tokens."""
    import captum.attr as ca

    bert = testing.bert("base")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (2, 512), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    attention = torch.ones_like(ids)
    embeddings = bert.bert.embeddings.word_embeddings
    pad = embeddings(torch.zeros(1, 1, dtype=torch.long)).detach()
    target = torch.tensor([0, 1])
    token_ids = torch.arange(512).view(1, 512)
    window = 32
    ours = sopfast.MaskedForward(bert, {"input_ids": ids, "attention_mask": attention})
    recorder = _Recorder(ours)

    def plain():
        forward = lambda e: bert(inputs_embeds=e, attention_mask=torch.ones(e.shape[:2], dtype=torch.long)).logits
        method = getattr(ca, explainer)(forward)
        with torch.no_grad():
            e = embeddings(ids)
            base = pad.expand_as(e)
            if explainer == "Occlusion":
                extra = {"sliding_window_shapes": (window, 768), "strides": (window, 768)}
            else:
                extra = {"feature_mask": token_ids.unsqueeze(-1).expand(1, 512, 768), **kwargs}
            return method.attribute(e, baselines=base, target=target, perturbations_per_eval=PER_EVAL, **extra)

    def fast():
        method = getattr(ca, "FeatureAblation" if explainer == "Occlusion" else explainer)(recorder)
        extra = {"feature_mask": token_ids // window} if explainer == "Occlusion" else kwargs
        return method.attribute(
            ours.presence,
            target=target,
            additional_forward_args=ours.example_ids,
            perturbations_per_eval=PER_EVAL,
            **extra,
        )

    return plain, fast, 768, 512, 0, recorder


def _rise_case(keep: float, masks: int) -> tuple[Callable, Callable, int, int, int, _Recorder]:
    """RISE with sparse masks on ViT-B/16: the plain model on images with the dropped patches zeroed
    (every mask a full pass) vs :func:`sopfast.rise` in drop mode (the same masks)."""
    vit = testing.vit("b16", num_labels=10)
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    target = torch.arange(4)
    chosen = sopfast.masking.rise_masks(4, (14, 14), masks, keep, 7, torch.Generator().manual_seed(0))
    recorder = _Recorder(sopfast.MaskedForward(vit, x))
    recorder.kept.append(chosen.reshape(-1, 196).sum(1))

    def plain():
        saliency = torch.zeros(4, 196)
        for j in range(0, masks, PER_EVAL):
            block = chosen[:, j : j + PER_EVAL].float()  # [4, n, 196]
            pixels = block.view(4, -1, 14, 14).repeat_interleave(16, 2).repeat_interleave(16, 3)
            images = (x.unsqueeze(1) * pixels.unsqueeze(2)).flatten(0, 1)
            probs = vit(pixel_values=images).logits.softmax(-1).view(4, -1, 10)
            saliency += (probs.gather(2, target.view(4, 1, 1).expand(4, block.shape[1], 1)) * block).sum(1)
        return saliency / (masks * keep)

    def fast():
        return sopfast.rise(vit, x, target, num_masks=masks, keep=keep, cells=7, mode="drop")

    return plain, fast, 768, 196, 1, recorder


def _time(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cases() -> list[tuple[str, str, dict, Callable[[], tuple]]]:
    """``(model, explainer, settings, build)`` for every row."""
    models = (("ViT-B/16 @224, batch 4", _vit_case), ("BERT-base @512, batch 2", _bert_case))
    rows = []
    for model, build in models:
        for name, (explainer, kwargs) in CASES.items():
            window = {"window": "2x2 patches" if "ViT" in model else "32 tokens"}
            label = name + (" (2×2-patch / 32-token windows)" if name == "Occlusion" else "")
            rows.append((model, label, kwargs or window, lambda b=build, e=explainer, k=kwargs: b(e, k)))
    rise_settings = {"keep": 0.2, "num_masks": 64, "cells": 7}
    rows.append(("ViT-B/16 @224, batch 4", "RISE (sparse masks)", rise_settings, lambda: _rise_case(0.2, 64)))
    return rows


def run(repeats: int) -> list[dict]:
    torch.set_grad_enabled(False)
    rows = []
    for model, name, settings, build in _cases():
        plain, fast, width, features, prefix, recorder = build()
        times: dict[str, list[float]] = {"plain": [], "sopfast": []}
        fixed = list(recorder.kept)  # RISE's masks are known up front; the explainers' are recorded
        for _ in range(repeats):
            times["plain"].append(_time(plain))
            recorder.kept[:] = fixed
            times["sopfast"].append(_time(fast))
        kept = torch.cat(recorder.kept)
        row = {
            "model": model,
            "explainer": name,
            "settings": settings,
            "passes": int(kept.numel()),
            "kept_fraction": float(kept.double().mean()) / features,
            "plain_s": statistics.median(times["plain"]),
            "sopfast_s": statistics.median(times["sopfast"]),
            "ideal": _flops(torch.full_like(kept, features + prefix), width) / _flops(kept + prefix, width),
        }
        row["speedup"] = row["plain_s"] / row["sopfast_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def write(rows: list[dict], out: Path, repeats: int) -> None:
    lines = [
        "# Captum on sopfast's drop path vs Captum on the plain model",
        "",
        f"`python bench/captum_speed.py` — {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, median of {repeats} alternating runs, "
        f"perturbations_per_eval {PER_EVAL}; random weights.",
        "",
        "| model | explainer | passes | mean kept fraction | plain (s) | sopfast drop (s) | speed-up | FLOP ideal |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['explainer']} | {r['passes']} | {r['kept_fraction']:.2f} | {r['plain_s']:.1f} | "
            f"{r['sopfast_s']:.1f} | **{r['speedup']:.2f}×** | {r['ideal']:.2f}× |"
        )
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/RESULTS_masking.md"))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    write(run(args.repeats), args.out, args.repeats)


if __name__ == "__main__":
    main()
