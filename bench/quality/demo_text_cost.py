"""Where the full text demo's time goes (issue #34: "within the demo's time budget; say what it costs").

On the text demo's cached backbone (``common.text_backbone``: MiniLM + head) and its test tweets, SOP as
the demo builds it (untrained: the cost of a forward does not depend on the weights).  Measures, one
method at a time, the seconds of the demo's two evaluations (:func:`sopfast.demo.text.text_parts`): the
main one (accuracy, groups, the τ × m curves) on ``--texts`` tweets and the curve one (fidelity,
insertion, deletion) on ``--curve-texts``; each baseline's cost is its run minus SOP's alone (so noise
can make a small one negative).  Then the
median seconds of ``--steps`` training steps (batch 16, the recipe's teacher).  Scaled to the full demo
(500 and 200 tweets, 2 seeds of 376 steps; the first seed runs every baseline, the second SOP and random
groups) it prints a markdown table; the diagnostic, the backbone and the pages are not counted.

    python bench/quality/demo_text_cost.py [--texts 40] [--curve-texts 16] [--steps 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import text_backbone, text_data, text_inputs, text_training_step

from sopfast.demo.shared import CURVE_METRICS
from sopfast.demo.text import (
    COMPARE_TEXTS,
    CURVE_TEXTS,
    TEXT_CURVE_COUNTS,
    TEXT_EPOCHS,
    TEXT_METRICS,
    TEXT_SOP_TEXTS,
    text_parts,
)
from sopfast.evaluation.baselines import available_baselines
from sopfast.evaluation.evaluate import evaluate
from sopfast.model.sop import SOP

BATCH = 16
STEPS = TEXT_EPOCHS * -(-TEXT_SOP_TEXTS // BATCH)


def evaluation_seconds(model: SOP, parts: dict, baselines: tuple[str, ...]) -> tuple[float, float]:
    """Seconds of the main and the curve evaluation of ``model`` with ``baselines`` over ``parts``."""
    main = curve = 0.0
    for loader, curve_loader in parts.values():
        options = {"baselines": baselines, "progress": False, "backbone_row": False, "curve_counts": TEXT_CURVE_COUNTS}
        start = time.perf_counter()
        evaluate(model, loader, metrics=TEXT_METRICS, **options)
        main += time.perf_counter() - start
        start = time.perf_counter()
        evaluate(model, curve_loader, metrics=CURVE_METRICS, **options)
        curve += time.perf_counter() - start
    return main, curve


def step_seconds(model: SOP, train_set, steps: int) -> float:
    """Median seconds of a training step (forward, loss with the teacher, backward, AdamW), batch 16."""
    model.train()
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=5e-4)
    times = []
    for s in range(steps + 1):
        rows = slice(BATCH * s, BATCH * (s + 1))
        seconds = text_training_step(model, optimizer, text_inputs(model, train_set, rows), train_set.labels[rows])
        if s:
            times.append(seconds)
    model.eval()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=40)
    parser.add_argument("--curve-texts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = parser.parse_args()
    backbone, (train_set, test_set) = text_backbone(), text_data()
    torch.manual_seed(0)
    model = SOP(backbone, num_groups=8, tau=0.2, mode="drop").eval()
    parts = text_parts(test_set.subset(torch.arange(args.texts)), args.curve_texts)
    main_scale, curve_scale = COMPARE_TEXTS / args.texts, CURVE_TEXTS / args.curve_texts
    sop_main, sop_curve = evaluation_seconds(model, parts, ())
    rows = [("SOP (each seed)", sop_main * main_scale, sop_curve * curve_scale, 2)]
    for name in available_baselines():
        m, c = evaluation_seconds(model, parts, (name,))
        rows.append((name, (m - sop_main) * main_scale, (c - sop_curve) * curve_scale, 2 if name == "random" else 1))
        print(f"{name}: {m - sop_main:.1f} s + {c - sop_curve:.1f} s", flush=True)
    step = step_seconds(model, train_set, args.steps)
    lines = [
        f"Text demo cost, `python bench/quality/demo_text_cost.py --texts {args.texts} --curve-texts "
        f"{args.curve_texts} --steps {args.steps}`: {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} thread(s), torch {torch.__version__}; measured on {args.texts} / "
        f"{args.curve_texts} tweets and scaled to the demo's {COMPARE_TEXTS} / {CURVE_TEXTS}.",
        "",
        "| part | main evaluation s | curve evaluation s | runs | demo s |",
        "|---|---:|---:|---:|---:|",
    ]
    total = 0.0
    for name, m, c, runs in rows:
        total += (m + c) * runs
        lines.append(f"| {name} | {m:.0f} | {c:.0f} | {runs} | {(m + c) * runs:.0f} |")
    training = step * STEPS * 2
    total += training
    lines.append(f"| SOP training: {STEPS} steps × {step:.2f} s | – | – | 2 | {training:.0f} |")
    lines.append(f"| **total** (diagnostic, backbone and pages not counted) | | | | **{total:.0f}** |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
