"""Insertion + deletion over one batch: sopfast's batched path vs the authors' per-example loop.

Run with ``PYTHONPATH=python python -m pytest bench/test_bench_eval.py``.  Both sides run in
the same session on the same (randomly initialised) ViT; only ratios between them mean
anything.  The test checks that both give the same scores and never asserts a speed.
"""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast import testing
from sopfast.evaluation import metrics as M
from sopfast.evaluation.evaluate import evaluate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH = 8
STEPS = [s / 10 for s in range(1, 11)]


def _model(mode: str) -> sopfast.SOP:
    backbone = testing.vit((64, 4, 4), image_size=64, patch_size=8, num_labels=10, mlp=128)
    return sopfast.SOP(backbone, num_groups=8, tau=0.2, mode=mode).to(DEVICE).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, 3, 64, 64, generator=g).to(DEVICE), torch.randint(0, 10, (BATCH,), generator=g).to(DEVICE)


def batched(model: sopfast.SOP, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    res = evaluate(model, [(x, y)], metrics=["insertion", "deletion"], progress=False)["SOP"]
    return res["insertion"], res["deletion"]


def per_example_loop(model: sopfast.SOP, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The authors' style: each example alone, each step a full model call (generator included)."""
    scores = []
    for deletion in (False, True):
        model.deletion = deletion
        rows = []
        with torch.no_grad():
            for i in range(x.shape[0]):
                rows.append(torch.stack([model(x[i : i + 1], tau=t).logits[0] for t in STEPS]))
        model.deletion = False
        curves = torch.stack(rows)
        scores.append(float(M.deletion(curves) if deletion else M.insertion(curves)))
    return scores[0], scores[1]


@pytest.mark.parametrize("mode", ["exact", "drop"])
@pytest.mark.parametrize("impl", [batched, per_example_loop], ids=["sopfast-batched", "per-example-loop"])
def test_insertion_deletion(benchmark, impl, mode):
    benchmark.group = f"insertion+deletion ViT d=64 m=8 B={BATCH} {mode} {DEVICE}"
    model = _model(mode)
    x, y = _batch()
    result = benchmark.pedantic(impl, args=(model, x, y), rounds=3, iterations=1, warmup_rounds=1)
    reference = batched(model, x, y) if impl is per_example_loop else per_example_loop(model, x, y)
    assert result == pytest.approx(reference, abs=1e-4)
