"""SOP end to end: the authors' algorithm (sopfast.model.reference) vs ``exact`` vs ``drop``.

Randomly initialised weights (fine for timing).  Sizes default to ones that finish in a few
minutes on 2 CPU cores; ``SOPFAST_BENCH_FULL=1`` runs the issue's sizes (ViT-B/16 at 224 with
batch 8, BERT-base at 512 with batch 4).  Peak memory (RSS high-water above the start, or
CUDA max allocated) goes into ``extra_info``; ``sopfast bench`` prints the same as one table.

    python -m pytest bench/test_bench_sop.py --benchmark-only --benchmark-group-by=group
"""

from __future__ import annotations

import os

import pytest
import torch

import sopfast
from sopfast import testing
from sopfast.benchmark import peak_memory_mib, step_functions

FULL = os.environ.get("SOPFAST_BENCH_FULL") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cases():
    vit_b = (768, 12, 12) if FULL else (384, 6, 6)
    bert_b = (768, 12, 12) if FULL else (256, 4, 4)
    return {
        "vit-b16" if FULL else "vit-small": (lambda: testing.vit(vit_b, num_labels=10), 8 if FULL else 2, "image", {}),
        "vit-tiny": (lambda: testing.vit("tiny", num_labels=10), 2, "image", {}),
        "bert-512": (lambda: testing.bert(bert_b), 4 if FULL else 1, "text", {}),
        "bert-512-pair": (lambda: testing.bert(bert_b), 4 if FULL else 1, "pair", {}),
        "cnn-resnet18": (testing.resnet18, 2, "image", {}),
    }


def _inputs(kind: str, batch: int):
    g = torch.Generator().manual_seed(0)
    if kind == "image":
        return (torch.randn(batch, 3, 224, 224, generator=g).to(DEVICE),)
    ids = torch.randint(1000, 20000, (batch, 512), generator=g)
    types = torch.zeros_like(ids)
    if kind == "pair":
        types[:, 384:] = 1
    return ids.to(DEVICE), torch.ones_like(ids).to(DEVICE), types.to(DEVICE)


CASES = _cases()


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train_step"])
@pytest.mark.parametrize("variant", ["reference", "exact", "drop"])
@pytest.mark.parametrize("case", list(CASES))
def test_sop_modes(benchmark, case, variant, train):
    factory, batch, kind, kwargs = CASES[case]
    torch.manual_seed(0)
    model = sopfast.SOP(factory(), num_groups=20, tau=0.2, recipe="paper", **kwargs).to(DEVICE)
    if variant not in ("reference", *model.adapter.supported_modes):
        pytest.skip(f"{case} has no {variant} mode")
    args = _inputs(kind, batch)
    labels = torch.zeros(batch, dtype=torch.long, device=DEVICE)
    model.train(train)
    fn = step_functions(model, args, labels, train)[variant]
    benchmark.group = f"{case} {'train_step' if train else 'forward'}"
    benchmark.extra_info["peak_mib"] = peak_memory_mib(fn, DEVICE)
    benchmark.extra_info["samples"] = batch
    ideal = model.adapter.drop_flop_ratio(model.prepare(*args), model.tau, model.num_groups, train)
    if ideal is not None:
        benchmark.extra_info["ideal_drop_ratio"] = ideal
    benchmark.pedantic(fn, rounds=2, warmup_rounds=1, iterations=1)
