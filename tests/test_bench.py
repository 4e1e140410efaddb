"""The drop FLOP model (``BackboneAdapter.drop_flop_ratio``): one owner, the adapter, which knows the
backbone's size and which tokens a ``drop`` pass runs; ``sopfast bench``, the demo and ``bench/`` ask it."""

from __future__ import annotations

import inspect

import pytest
import torch

import sopfast
from sopfast import benchmark
from sopfast.adapters.flops import ideal_drop_ratio
from sopfast.demo import run as demo_run
from sopfast.demo import shared as demo_shared
from sopfast.demo import text as demo_text
from sopfast.ops import num_kept
from sopfast.testing import make_bert, make_cnn, make_hf, make_hf_vit, text_batch


@pytest.mark.parametrize("tau", [0.2, 0.29, 0.5])
def test_vit_ratio_counts_the_models_k_plus_cls(tau):
    """num_kept(model.tau, d) kept patches plus CLS (no fixed 0.2·d), the encoder's size from its config."""
    model = sopfast.SOP(make_hf_vit(), num_groups=3, tau=tau)
    inputs = model.prepare(torch.randn(1, 3, 32, 32))
    d = 16
    expected = ideal_drop_ratio(d + 1, num_kept(tau, d) + 1, 3, 32, 2, 64, False)
    assert model.adapter.drop_flop_ratio(inputs, tau, 3, False) == pytest.approx(expected)


def test_text_ratio_counts_the_second_segment_and_cls():
    model = sopfast.SOP(make_bert(), recipe="paper", num_groups=4)
    ids, mask, types = text_batch()
    inputs = model.prepare(ids, mask, types)
    d = 10  # example 0: 14 tokens, the last 4 a second segment that every pass runs
    expected = ideal_drop_ratio(14, num_kept(0.2, d) + 4 + 1, 4, 32, 2, 64, True)
    assert model.adapter.drop_flop_ratio(inputs, 0.2, 4, True) == pytest.approx(expected)


@pytest.mark.parametrize(("family", "size"), [("hf-deit", (32, 2, 64)), ("hf-dinov2", (32, 2, 64))])
def test_families_read_their_own_config(family, size):
    """DeiT runs two prefix tokens; DINOv2 states its MLP as a ratio (``mlp_ratio``)."""
    model = sopfast.SOP(make_hf(family), num_groups=3)
    prefix = model.adapter.num_prefix_tokens
    assert prefix == (2 if family == "hf-deit" else 1)
    expected = ideal_drop_ratio(16 + prefix, num_kept(0.25, 16) + prefix, 3, *size, False)
    assert model.adapter.drop_flop_ratio(model.prepare(torch.randn(1, 3, 32, 32)), 0.25, 3, False) == pytest.approx(
        expected
    )


def test_distilbert_size_comes_from_its_own_config_names():
    adapter = sopfast.SOP(make_hf("hf-distilbert"), num_groups=3).adapter
    assert tuple(adapter.transformer_size()) == (32, 2, 64)  # dim, n_layers, hidden_dim


def test_no_ratio_without_a_drop_mode():
    model = sopfast.SOP(make_cnn(), num_groups=3, feature_layer="features")
    assert model.adapter.drop_flop_ratio(model.prepare(torch.randn(1, 3, 16, 16)), 0.2, 3, False) is None
    deberta = sopfast.SOP(make_hf("hf-deberta-v2"), num_groups=3)
    assert deberta.adapter.drop_flop_ratio(deberta.prepare(*text_batch()), 0.2, 3, False) is None


def test_benchmark_and_demo_read_no_backbone_config():
    """The FLOP model is written once: the bench and demo modules read no HF config field themselves, and
    the benchmark's ResNet gets its feature layer from its adapter."""
    for module in (benchmark, demo_run, demo_shared, demo_text):
        source = inspect.getsource(module)
        assert "intermediate_size" not in source and "num_hidden_layers" not in source, module.__name__
    assert "layer3" not in inspect.getsource(benchmark)


def test_timm_and_torchvision_vits_have_the_same_flop_model():
    """The same tiny ViT (32 wide, 2 blocks, MLP 64 vs timm's 4×) in three libraries: one FLOP model each."""
    from test_exact_vs_reference import make_torchvision_vit

    from sopfast.testing import make_timm_vit

    x = torch.randn(1, 3, 32, 32)
    for backbone, mlp in ((make_timm_vit(), 128), (make_torchvision_vit(), 64)):
        model = sopfast.SOP(backbone, num_groups=3)
        expected = ideal_drop_ratio(17, num_kept(0.25, 16) + 1, 3, 32, 2, mlp, False)
        assert model.adapter.drop_flop_ratio(model.prepare(x), 0.25, 3, False) == pytest.approx(expected)
