"""Masked inference (sopfast.masking): Captum KernelSHAP on the plain HF ViT vs on sopfast's drop and
exact paths, and masked_forward alone, at a size that finishes in a minute on 2 CPU cores
(``bench/captum_speed.py`` runs ViT-B/16 and BERT-base and writes bench/RESULTS_masking.md).

    python -m pytest bench/test_bench_masking.py --benchmark-only --benchmark-group-by=group
"""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast import testing

captum = pytest.importorskip("captum.attr")
SAMPLES = 32


@pytest.fixture(scope="module")
def vit():
    return testing.vit((192, 4, 3), num_labels=10)


@pytest.fixture(scope="module")
def images():
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("path", ["plain", "exact", "drop"])
def test_kernelshap(benchmark, vit, images, path):
    target = torch.tensor([0, 1])
    if path == "plain":
        ids = torch.arange(196).view(14, 14).repeat_interleave(16, 0).repeat_interleave(16, 1)
        explainer = captum.KernelShap(lambda p: vit(pixel_values=p).logits)
        kwargs = {"baselines": 0.0, "feature_mask": ids.expand(1, 3, 224, 224).contiguous()}
        inputs = images
    else:
        forward = sopfast.MaskedForward(vit, images, mode=path)
        explainer = captum.KernelShap(forward)
        kwargs = {"additional_forward_args": forward.example_ids}
        inputs = forward.presence

    def run():
        torch.manual_seed(0)
        with torch.no_grad():
            return explainer.attribute(inputs, target=target, n_samples=SAMPLES, perturbations_per_eval=16, **kwargs)

    benchmark.group = f"KernelSHAP, ViT 4 layers @224, {SAMPLES} samples"
    benchmark.pedantic(run, rounds=2, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_masked_forward(benchmark, vit, images, mode):
    masks = torch.rand(2, 64, 196, generator=torch.Generator().manual_seed(0)) < 0.2
    masks[..., 0] = True
    benchmark.group = "masked_forward, 64 masks keeping ~20 % of 196 patches"
    benchmark.pedantic(lambda: sopfast.masked_forward(vit, images, masks, mode=mode), rounds=2, iterations=1)
