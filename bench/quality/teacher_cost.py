"""What the saliency teacher costs in a text training step, and what running the full input once saves.

On the text demo's cached backbone (``common.text_backbone``: MiniLM + head) and its training tweets
(batch 16, 48 tokens), SOP as the text demo builds it (the ``"sopfast"`` recipe: 8 groups, τ = 0.2,
drop, the 5-level teacher).  Two teachers, interleaved round by round in one process:

* ``per level`` (0.5.2): each level runs the backbone on the full input again for the class it
  differentiates — ``feature_saliency`` without a ``target``;
* ``once`` (0.5.3, :func:`sopfast.model.losses.mean_saliency`): that forward runs once per batch.

Both give the same saliency (``torch.equal`` is checked here and in ``tests/test_quality_options.py``).
Prints the median seconds of the teacher alone and of a whole training step (forward, loss, backward,
AdamW) with each; results in ``bench/RESULTS_training.md``.

    python bench/quality/teacher_cost.py [threads] [rounds]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import text_backbone, text_data, text_inputs, text_training_step

import sopfast.model.penalty as penalty
from sopfast.model.losses import feature_saliency, mean_saliency
from sopfast.model.sop import SOP

BATCH = 16


def per_level_saliency(model: SOP, inputs, levels) -> torch.Tensor:
    """The 0.5.2 teacher: every level predicts the full input again."""
    return torch.stack([feature_saliency(model, inputs, z) for z in levels]).mean(dim=0)


TEACHERS: dict[str, Callable] = {"per level": per_level_saliency, "once": mean_saliency}


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    torch.set_num_threads(threads)
    backbone, (train_set, _) = text_backbone(), text_data()
    torch.manual_seed(0)
    model = SOP(backbone, num_groups=8, tau=0.2, mode="drop").train()
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=5e-4)
    batches = [
        (text_inputs(model, train_set, slice(s, s + BATCH)), train_set.labels[s : s + BATCH])
        for s in range(0, BATCH * (rounds + 1), BATCH)
    ]
    levels = model.saliency_levels
    first = batches[0][0]
    if not torch.equal(per_level_saliency(model, first, levels), mean_saliency(model, first, levels)):
        raise SystemExit("the two teachers differ")

    teacher_s: dict[str, list[float]] = {k: [] for k in TEACHERS}
    step_s: dict[str, list[float]] = {k: [] for k in TEACHERS}
    for inputs, labels in batches[1:]:
        for name, teacher in TEACHERS.items():
            start = time.perf_counter()
            teacher(model, inputs, levels)
            teacher_s[name].append(time.perf_counter() - start)
            penalty.mean_saliency = teacher
            step_s[name].append(text_training_step(model, optimizer, inputs, labels))
    penalty.mean_saliency = mean_saliency
    print(
        f"text demo SOP step (batch {BATCH}, {tuple(first.input_ids.shape)[1]} tokens, {len(levels)} teacher "
        f"levels), {threads} thread(s), median of {rounds} interleaved rounds:"
    )
    for name in TEACHERS:
        t, s = statistics.median(teacher_s[name]), statistics.median(step_s[name])
        print(f"  teacher {name:9s}: {t:.2f} s   whole step: {s:.2f} s   (teacher {100 * t / s:.0f} % of the step)")
    once, per_level = statistics.median(step_s["once"]), statistics.median(step_s["per level"])
    print(f"  step 'once' / 'per level': {once / per_level:.2f}")
    without = once - statistics.median(teacher_s["once"])
    print(f"  a step with the teacher ('once') / without it (step minus teacher): {once / without:.1f}x")


if __name__ == "__main__":
    main()
