"""``mode="drop"``: exact for BERT; for ViT equal to running the backbone on the kept tokens alone."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.testing import make_bert, make_hf_vit, make_timm_vit, text_batch


@pytest.mark.parametrize("pairs", [True, False])
@pytest.mark.parametrize("config", [dict(num_groups=4, tau=0.2), dict(num_groups=3, tau=0.5, deletion=True)])
def test_bert_drop_equals_exact(pairs, config):
    model = sopfast.SOP(make_bert(), group_batch_size=5, **config).eval()
    ids, mask, types = text_batch(pairs=pairs)
    with torch.no_grad():
        exact = model(ids, mask, types, mode="exact")
        drop = model(ids, mask, types, mode="drop")
    assert torch.equal(exact.group_masks, drop.group_masks)
    for name in ("group_logits", "group_scores", "lam", "logits"):
        torch.testing.assert_close(getattr(drop, name), getattr(exact, name), atol=1e-5, rtol=0)


@pytest.mark.parametrize("keep_special_tokens", [True, False])
@pytest.mark.parametrize("tau", [0.29, 0.5])
def test_bert_drop_widths_bound_the_passes_and_change_nothing(keep_special_tokens, tau):
    """The widths counted from the inputs before the projection pass (no GPU sync) are upper bounds of the
    tokens each pass runs, and padding the passes to them gives the counted widths' logits."""
    model = sopfast.SOP(make_bert(), num_groups=4, tau=tau, keep_special_tokens=keep_special_tokens).eval()
    ids, mask, types = text_batch(pairs=True)
    inputs = model.prepare(ids, mask, types)
    with torch.no_grad():
        groups = model.make_groups(inputs)
        assert groups.drop_widths is not None
        bounded = model.adapter._drop_pass_widths(inputs, groups)
        runs = model.adapter._keep(inputs, groups).clone()
        runs[:, 0] = True
        counted = runs.sum(dim=1).tolist()
        assert all(b >= c for b, c in zip(bounded, counted)) and bounded != counted
        by_bound = model.predict_groups(inputs, groups, mode="drop")
        groups.drop_widths = None
        by_count = model.predict_groups(inputs, groups, mode="drop")
    torch.testing.assert_close(by_bound.logits, by_count.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(by_bound.group_logits, by_count.group_logits, atol=1e-5, rtol=0)


def _hf_vit_on_tokens(backbone, x, keep):
    """The HF ViT run on CLS + the patches in ``keep`` (positions added before the gather)."""
    vit = backbone.vit
    h = vit.embeddings(x.unsqueeze(0))[:, torch.cat([torch.zeros(1, dtype=torch.long), keep + 1])]
    for layer in vit.layers:
        h = layer(h, None)
    return backbone.classifier(vit.layernorm(h[:, 0]))[0]


def _timm_vit_on_tokens(backbone, x, keep):
    t = backbone._pos_embed(backbone.patch_embed(x.unsqueeze(0)))
    t = t[:, torch.cat([torch.arange(backbone.num_prefix_tokens), keep + backbone.num_prefix_tokens])]
    return backbone.forward_head(backbone.norm(backbone.blocks(t)))[0]


@pytest.mark.parametrize(
    "factory,run_alone", [(make_hf_vit, _hf_vit_on_tokens), (make_timm_vit, _timm_vit_on_tokens)], ids=["hf", "timm"]
)
def test_vit_drop_equals_backbone_on_kept_tokens(factory, run_alone):
    backbone = factory()
    model = sopfast.SOP(backbone, num_groups=5, tau=0.25, mode="drop", group_batch_size=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model(x)
        for b in range(2):
            for i in range(5):
                keep = out.group_masks[b, i].nonzero().flatten()
                expected = run_alone(backbone, x[b], keep)
                torch.testing.assert_close(out.group_logits[b, i], expected, atol=1e-5, rtol=0)


def test_vit_drop_differs_from_exact_but_shares_groups():
    model = sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        exact, drop = model(x, mode="exact"), model(x, mode="drop")
    assert torch.equal(exact.group_masks, drop.group_masks)
    torch.testing.assert_close(exact.lam, drop.lam)
    assert not torch.allclose(exact.group_logits, drop.group_logits, atol=1e-4)


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_gradients_reach_generator_and_selector_in_both_modes(mode):
    model = sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25, mode=mode).train()
    x, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    opt = torch.optim.Adam(model.trainable_parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model(x).loss(labels)
        opt.zero_grad()
        loss.backward()
        for name in ("generator.heads.0", "selector.class_queries", "selector.key_proj.weight"):
            grad = dict(model.named_parameters())[name].grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.grad is None for p in model.backbone.parameters())


@pytest.mark.parametrize("mode", ["exact", "drop"])
@pytest.mark.parametrize("family", ["vit", "bert"])
def test_autocast_bf16(mode, family):
    if family == "vit":
        model, args = sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25), (torch.randn(2, 3, 32, 32),)
    else:
        model, args = sopfast.SOP(make_bert(), num_groups=3, tau=0.25), text_batch()
    model.eval()
    with torch.no_grad():
        full = model(*args, mode=mode)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(*args, mode=mode)
    assert half.logits.dtype == torch.float32 and half.group_scores.dtype == torch.float32
    torch.testing.assert_close(half.group_scores.sum(-1), torch.ones_like(half.group_scores.sum(-1)))
    torch.testing.assert_close(half.logits, full.logits, atol=0.1, rtol=0.1)
