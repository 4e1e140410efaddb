"""sopfast.benchmark: the ``sopfast bench`` helpers (moved there from sopfast.demo)."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.benchmark import _ideal_ratio, ideal_drop_ratio
from sopfast.ops import num_kept
from sopfast.testing import make_hf_vit


@pytest.mark.parametrize("tau", [0.2, 0.29, 0.5])
def test_ideal_ratio_keeps_the_models_k(tau):
    """The ideal FLOP ratio counts num_kept(model.tau, d) kept patches plus CLS (no fixed 0.2·d)."""
    model = sopfast.SOP(make_hf_vit(), num_groups=3, tau=tau)
    x = torch.randn(1, 3, 32, 32)
    d = model.adapter.num_features(model.prepare(x))
    cfg = model.backbone.config
    expected = ideal_drop_ratio(
        d + 1, num_kept(tau, d) + 1, 3, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, False
    )
    assert _ideal_ratio(model, (x,), "image", False) == pytest.approx(expected)
