"""Activation checkpointing of the projection: same loss and gradients, layers recomputed in backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sopfast
from sopfast.adapters import base as adapter_base
from sopfast.testing import make_bert, make_cnn, make_hf_vit, make_timm_vit, text_batch

FAMILIES = {
    "hf_vit": (make_hf_vit, lambda: (torch.randn(2, 3, 32, 32),), torch.tensor([0, 2])),
    "timm_vit": (make_timm_vit, lambda: (torch.randn(2, 3, 32, 32),), torch.tensor([1, 2])),
    "bert": (make_bert, text_batch, torch.tensor([0, 1, 1])),
}


def _loss_and_grads(model: sopfast.SOP, args, labels, mode: str):
    torch.manual_seed(5)  # the projection's dropout draws the same masks in both runs
    model.zero_grad(set_to_none=True)
    out = model(*args, mode=mode)
    out.loss(labels).backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_checkpointed_projection_gives_the_same_gradients(family, mode, monkeypatch):
    factory, inputs, labels = FAMILIES[family]
    torch.manual_seed(0)
    model = sopfast.SOP(factory(), num_groups=4, tau=0.25, checkpoint_projection=False).train()
    for module in model.projection.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.1
    args = inputs()
    plain_logits, plain = _loss_and_grads(model, args, labels, mode)

    calls = []
    original = adapter_base.checkpoint
    monkeypatch.setattr(adapter_base, "checkpoint", lambda *a, **k: calls.append(1) or original(*a, **k))
    model.checkpoint_projection = True
    logits, grads = _loss_and_grads(model, args, labels, mode)
    assert len(calls) == 1  # the tiny backbones have 2 layers; the projection runs the first
    torch.testing.assert_close(logits, plain_logits, atol=1e-6, rtol=0)
    assert grads.keys() == plain.keys() and len(grads) > 3
    for name in grads:
        torch.testing.assert_close(grads[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_default_is_on_where_supported_and_cnns_refuse_it():
    assert sopfast.SOP(make_hf_vit(), num_groups=4).checkpoint_projection is True
    cnn = sopfast.SOP(make_cnn(), num_groups=4, feature_layer="features")
    assert cnn.checkpoint_projection is False
    with pytest.raises(ValueError, match="checkpoint_projection=True is not supported by CNNAdapter"):
        sopfast.SOP(make_cnn(), num_groups=4, feature_layer="features", checkpoint_projection=True)
    with pytest.raises(TypeError, match="checkpoint_projection must be True, False or None"):
        sopfast.SOP(make_hf_vit(), checkpoint_projection="yes")


def test_no_checkpointing_without_autograd(monkeypatch):
    calls = []
    monkeypatch.setattr(adapter_base, "checkpoint", lambda *a, **k: calls.append(1))
    model = sopfast.SOP(make_hf_vit(), num_groups=4, checkpoint_projection=True).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert calls == []
