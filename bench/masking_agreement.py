"""How far perturbation attributions computed on the ``drop`` path agree with the ``exact`` path.

For the demo's ViT as trained (Fashion-MNIST, 49 patches, no masking; ``bench/quality/common.py``
trains it once and caches it), the same ViT after ``sopfast.adapt_backbone``, and the text demo's
MiniLM (tweets), every explainer runs twice with the same seed through :func:`sopfast.masking.agreement`
— in ``exact`` mode (removed patches are blank patches; removed tokens are attention-masked) and in
``drop`` mode (only the kept tokens run) — and the table gives, per method, the Spearman rank
correlation of the two attributions per example (over the input's features: median, mean and 10th
percentile) and the overlap of their top-20 % features (intersection over union).  BERT's drop path
equals its exact path, so MiniLM's rows measure Captum's own sampling noise only when a method samples
(seeded alike, they should agree exactly).

    python bench/masking_agreement.py      # about 15 min on 2 cores; writes bench/RESULTS_masking_agreement.md
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "quality"))

import common

import sopfast

TOP = 0.2


METHODS = {
    "KernelSHAP": "kernelshap",
    "LIME": "lime",
    "Occlusion (1 feature)": "occlusion",
    "Shapley sampling": "shapley_sampling",
    "RISE": "rise",
}


def compare(backbone, batches: list, samples: int) -> list[dict]:
    """Every method of :data:`METHODS` through :func:`sopfast.masking.agreement` (exact vs drop, the same
    seed) on each batch."""
    rows = []
    for name, explainer in METHODS.items():
        rho, overlap = [], []
        for inputs in batches:
            report = sopfast.masking.agreement(
                backbone, inputs, explainer=explainer, samples=samples * 4 if explainer == "rise" else samples, top=TOP
            )
            rho.append(report.spearman)
            overlap.append(report.top_overlap)
        rho_t = torch.cat(rho)
        rows.append(
            {
                "method": name,
                "examples": len(rho_t),
                "spearman_median": float(rho_t.median()),
                "spearman_mean": float(rho_t.mean()),
                "spearman_p10": float(rho_t.quantile(0.1)),
                "top20_iou": float(torch.cat(overlap).mean()),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def image_batches(n: int, batch: int) -> list[torch.Tensor]:
    _, test = common.image_data()
    return [test.x[s : s + batch] for s in range(0, n, batch)]


def text_batches(n: int, batch: int) -> list[dict]:
    _, test = common.text_data()
    out = []
    for s in range(0, n, batch):
        items = [test[i] for i in range(s, min(n, s + batch))]
        out.append({k: torch.stack([it[k] for it in items]) for k in ("input_ids", "attention_mask", "token_type_ids")})
    return out


def write(tables: dict[str, list[dict]], out: Path, samples: int) -> None:
    lines = [
        "# Perturbation attributions: drop path vs exact path",
        "",
        f"`python bench/masking_agreement.py` — {platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; {samples} samples for KernelSHAP / LIME, {samples * 4} masks for RISE; "
        "Spearman ρ per example over its features (`sopfast.masking.agreement`); top-20 % IoU.",
        "",
    ]
    for model, rows in tables.items():
        lines += [
            f"## {model}",
            "",
            "| method | examples | Spearman ρ (median) | ρ (mean) | ρ (10th pct.) | top-20 % IoU |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['method']} | {r['examples']} | {r['spearman_median']:.3f} | {r['spearman_mean']:.3f} | "
                f"{r['spearman_p10']:.3f} | {r['top20_iou']:.3f} |"
            )
        lines.append("")
    out.write_text("\n".join(lines), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(tables, indent=1), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/RESULTS_masking_agreement.md"))
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--texts", type=int, default=100)
    parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    images = image_batches(args.images, 50)
    tables = {
        "demo ViT as trained (4 layers, Fashion-MNIST, 49 patches; no masking in training)": compare(
            common.image_backbone(), images, args.samples
        ),
        "the same ViT after sopfast.adapt_backbone (random patch masking)": compare(
            common.adapted_image_backbone(), images, args.samples
        ),
        "MiniLM + trained head (tweets, tokens)": compare(
            common.text_backbone(), text_batches(args.texts, 25), args.samples
        ),
    }
    write(tables, args.out, args.samples)


if __name__ == "__main__":
    main()
