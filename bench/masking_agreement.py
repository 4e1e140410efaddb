"""How far perturbation attributions computed on the ``drop`` path agree with the ``exact`` path.

For the demo's ViT (Fashion-MNIST, 49 patches; ``bench/quality/common.py`` trains it once and caches
it) and the text demo's MiniLM (tweets), every explainer runs twice with the same seed — through
:class:`sopfast.MaskedForward` in ``exact`` mode (removed patches are blank patches; removed tokens are
attention-masked) and in ``drop`` mode (only the kept tokens run) — and the table gives, per method,
the Spearman rank correlation of the two attributions per example (over the input's features, mean
and 10th percentile), the overlap of their top-20 % features (intersection over union) and the time
ratio exact / drop.  BERT's drop path equals its exact path, so MiniLM's rows measure Captum's own
sampling noise only when a method samples (seeded alike, they should agree exactly).

    python bench/masking_agreement.py      # about 10 min on 2 cores; writes bench/RESULTS_masking_agreement.md
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "quality"))

import common

import sopfast
from sopfast.masking import rise

TOP = 0.2


def _methods(samples: int) -> dict[str, Callable]:
    import captum.attr as ca

    def captum(cls, **kwargs):
        def run(forward, target):
            torch.manual_seed(0)
            return cls(forward).attribute(
                forward.presence, target=target, additional_forward_args=forward.example_ids, **kwargs
            )

        return run

    return {
        "KernelSHAP": captum(ca.KernelShap, n_samples=samples, perturbations_per_eval=samples),
        "LIME": captum(ca.Lime, n_samples=samples, perturbations_per_eval=samples),
        "Occlusion (1 feature)": captum(ca.Occlusion, sliding_window_shapes=(1,), perturbations_per_eval=64),
        "Shapley sampling": captum(ca.ShapleyValueSampling, n_samples=2, perturbations_per_eval=64),
        "RISE": lambda forward, target: rise(
            forward.adapter, forward.inputs, target, num_masks=samples * 4, mode=forward.mode, seed=0
        ),
    }


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    from scipy.stats import spearmanr

    value = spearmanr(a.numpy(), b.numpy()).statistic
    return float(value) if value == value else 1.0  # constant rows (nothing to rank) agree


def _top(a: torch.Tensor, k: int) -> set[int]:
    return set(a.topk(k).indices.tolist())


def compare(backbone, batches: list, samples: int) -> list[dict]:
    rows = []
    for name, method in _methods(samples).items():
        rho, iou, seconds = [], [], {"exact": 0.0, "drop": 0.0}
        for inputs in batches:
            results = {}
            for mode in ("exact", "drop"):
                forward = sopfast.MaskedForward(backbone, inputs, mode=mode)
                with torch.no_grad():
                    target = forward.adapter.full_forward(forward.inputs)[0].argmax(-1)
                start = time.perf_counter()
                results[mode] = method(forward, target).float()
                seconds[mode] += time.perf_counter() - start
            valid = forward.presence.bool()
            for b in range(valid.shape[0]):
                e, d = results["exact"][b][valid[b]], results["drop"][b][valid[b]]
                rho.append(_spearman(e, d))
                k = max(1, round(TOP * len(e)))
                top_e, top_d = _top(e, k), _top(d, k)
                iou.append(len(top_e & top_d) / len(top_e | top_d))
        rho_t = torch.tensor(rho)
        rows.append(
            {
                "method": name,
                "examples": len(rho),
                "spearman_mean": float(rho_t.mean()),
                "spearman_p10": float(rho_t.quantile(0.1)),
                "top20_iou": float(torch.tensor(iou).mean()),
                "exact_over_drop_time": seconds["exact"] / max(seconds["drop"], 1e-9),
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
        "Spearman ρ per example over its features; top-20 % IoU; time ratio exact / drop (same run).",
        "",
    ]
    for model, rows in tables.items():
        lines += [
            f"## {model}",
            "",
            "| method | examples | Spearman ρ (mean) | ρ (10th pct.) | top-20 % IoU | time exact / drop |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['method']} | {r['examples']} | {r['spearman_mean']:.3f} | {r['spearman_p10']:.3f} | "
                f"{r['top20_iou']:.3f} | {r['exact_over_drop_time']:.2f}× |"
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
    tables = {
        "demo ViT (4 layers, Fashion-MNIST, 49 patches)": compare(
            common.image_backbone(), image_batches(args.images, 50), args.samples
        ),
        "MiniLM + trained head (tweets, tokens)": compare(
            common.text_backbone(), text_batches(args.texts, 25), args.samples
        ),
    }
    write(tables, args.out, args.samples)


if __name__ == "__main__":
    main()
