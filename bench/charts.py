"""The README's two charts.

* Speed: SOP's `exact` and `drop` against the authors' algorithm, on the CPU and on a GPU.  Every bar is a
  ratio measured side by side with the authors' algorithm in one run and written in a committed results
  file; :data:`SPEED` names the file and the text it appears as, and ``tests/test_charts.py`` checks that
  each value still stands there, so the chart cannot drift from the measurements.
* Quality: accuracy and agreement with the backbone of SOP with the 0.5.3 and the 0.6.1 recipe and of random
  groups through the 0.6.1 selector, per backbone, read from ``bench/quality/agreement_research.jsonl`` (every
  row and seed of ``bench/quality/agreement_research.py``; mean and full range over the seeds).

    python bench/charts.py        # writes docs/img/speed.png and docs/img/quality.png
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "img", "speed.png")
GPU = "bench/RESULTS_gpu.md"


@dataclass(frozen=True)
class Bar:
    """One measured speed-up over the authors' algorithm: ``where`` (CPU/GPU), ``what`` (model and step),
    ``mode`` (``exact``/``drop``), the ratio, and the results file with the text ``quoted`` in it."""

    where: str
    what: str
    mode: str
    ratio: float
    source: str
    quoted: str


SPEED = (
    Bar("CPU, 2 cores", "ViT-B/16 forward (8)", "exact", 0.99, "bench/RESULTS.md", "| 0.99× ³ | **4.48×** |"),
    Bar("CPU, 2 cores", "ViT-B/16 forward (8)", "drop", 4.48, "bench/RESULTS.md", "| 0.99× ³ | **4.48×** |"),
    Bar("CPU, 2 cores", "ViT-B/16 training step (8)", "exact", 0.97, "bench/RESULTS.md", "| 0.97× ³ | **3.25×** |"),
    Bar("CPU, 2 cores", "ViT-B/16 training step (8)", "drop", 3.25, "bench/RESULTS.md", "| 0.97× ³ | **3.25×** |"),
    Bar("CPU, 2 cores", "BERT-base-512 forward (4)", "exact", 0.98, "bench/RESULTS.md", "| 0.98× | **4.51×** |"),
    Bar("CPU, 2 cores", "BERT-base-512 forward (4)", "drop", 4.51, "bench/RESULTS.md", "| 0.98× | **4.51×** |"),
    Bar("NVIDIA H200", "ViT-B/16 forward (128)", "exact", 3.4, GPU, "| 431 (3.40×) | **1,623 (12.8×)** |"),
    Bar("NVIDIA H200", "ViT-B/16 forward (128)", "drop", 12.8, GPU, "| 431 (3.40×) | **1,623 (12.8×)** |"),
    Bar("NVIDIA H200", "ViT-B/16 training step (32)", "exact", 4.48, GPU, "exact / drop | 4.48 / **5.87** |"),
    Bar("NVIDIA H200", "ViT-B/16 training step (32)", "drop", 5.87, GPU, "exact / drop | 4.48 / **5.87** |"),
    Bar("NVIDIA H200", "BERT-base-512 training step (16)", "exact", 2.22, GPU, "exact / drop | 2.22 / **3.52** |"),
    Bar("NVIDIA H200", "BERT-base-512 training step (16)", "drop", 3.52, GPU, "exact / drop | 2.22 / **3.52** |"),
)


def speed_chart(path: str = OUT) -> str:
    """Draw :data:`SPEED` as grouped horizontal bars (log scale, 1× marked) into ``path``; returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys((b.where, b.what) for b in SPEED))
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.2))
    height = 0.38
    for i, (where, what) in enumerate(rows):
        for j, mode in enumerate(("exact", "drop")):
            bar = next(b for b in SPEED if (b.where, b.what, b.mode) == (where, what, mode))
            y = i + (j - 0.5) * height
            ax.barh(y, bar.ratio, height, color=("#9ecae1", "#3182bd")[j], label=mode if i == 0 else None)
            ax.text(bar.ratio * 1.04, y, f"{bar.ratio:g}×", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{what}\n{where}" for where, what in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ticks = [0.5, 1, 2, 5, 10, 20]
    ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
    ax.set_xlim(0.5, 30)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("speed vs the authors' algorithm, side by side in one run (batch in brackets)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("sopfast vs the authors' SOP (m = 20 groups, τ = 0.2)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


QUALITY = os.path.join(ROOT, "docs", "img", "quality.png")
RESEARCH = os.path.join(ROOT, "bench", "quality", "agreement_research.jsonl")
#: The research rows the quality chart compares (``bench/quality/agreement_research.py``'s ROWS).
RECIPE_053, RECIPE_NOW = "recipe", "prior3-suff4-sal0-explore0.5"
BACKBONE_NAMES = {
    "plain": "demo ViT",
    "adapted": "its adapted copy",
    "deit": "DeiT (6 layers)",
    "cnn": "ResNet-style CNN",
    "minilm": "MiniLM (text)",
}


def quality_rows(path: str = RESEARCH, tau: str = "tau=0.2") -> dict[tuple[str, str], list[float]]:
    """``{(backbone, bar): [values over seeds]}`` of accuracy and agreement for the chart's three bars."""
    import json

    out: dict[tuple[str, str], list[float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            bars = {
                RECIPE_053: [("SOP, 0.5.3 recipe", "SOP")],
                RECIPE_NOW: [("SOP, 0.6.1 recipe", "SOP"), ("random groups, 0.6.1 selector", "Random")],
            }
            for bar, method in bars.get(record["row"], []):
                for metric in ("accuracy", "agreement"):
                    out.setdefault((record["backbone"], f"{bar}|{metric}"), []).append(record[tau][method][metric])
            if record["row"] == RECIPE_NOW and "Backbone" in record[tau]:
                out.setdefault((record["backbone"], "backbone|accuracy"), []).append(
                    record[tau]["Backbone"]["accuracy"]
                )
    return out


def quality_chart(path: str = QUALITY, research: str = RESEARCH) -> str:
    """Accuracy and agreement per backbone (mean, with the range over seeds as an error bar) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = quality_rows(research)
    backbones = [
        b
        for b in BACKBONE_NAMES
        if any(k[0] == b and RECIPE_NOW for k in rows) and (b, "SOP, 0.6.1 recipe|accuracy") in rows
    ]
    bars = ("SOP, 0.5.3 recipe", "SOP, 0.6.1 recipe", "random groups, 0.6.1 selector")
    colours = ("#bdbdbd", "#3182bd", "#fd8d3c")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=False)
    width = 0.26
    for ax, metric in zip(axes, ("agreement", "accuracy")):
        for j, bar in enumerate(bars):
            for i, backbone in enumerate(backbones):
                values = rows.get((backbone, f"{bar}|{metric}"))
                if not values:
                    continue
                mean = sum(values) / len(values)
                err = [[mean - min(values)], [max(values) - mean]]
                ax.bar(i + (j - 1) * width, mean, width, yerr=err, color=colours[j], label=bar if i == 0 else None)
        if metric == "accuracy":
            for i, backbone in enumerate(backbones):
                values = rows.get((backbone, "backbone|accuracy"))
                if values:
                    label = "the backbone itself" if i == 0 else None
                    ax.hlines(max(values), i - 1.5 * width, i + 1.5 * width, color="black", lw=1.5, label=label)
            ax.legend(fontsize=8, loc="lower left")
        ax.set_xticks(range(len(backbones)), [BACKBONE_NAMES[b] for b in backbones], fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title("agreement with the backbone's prediction" if metric == "agreement" else "accuracy", fontsize=10)
    axes[0].legend(fontsize=8, loc="lower left", handles=axes[0].get_legend_handles_labels()[0])
    text = "minilm" in backbones
    where = "m = 20 (text: m = 8), 1,000 test images (text: 500)" if text else "m = 20, 1,000 Fashion-MNIST test images"
    fig.suptitle(f"SOP at τ = 0.2, {where}; bars: mean, lines: range over seeds", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(speed_chart())
    print(quality_chart())
