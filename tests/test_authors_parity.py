"""``mode="exact"`` follows the authors' code where it is fragile: saturated softmax and tie
order, H full-width heads, images whose side is not a multiple of the patch size.

``sopfast.model.reference.reference_forward`` is an independent, plain implementation of the
authors' algorithm (all candidate rows, torchvision blur, their ranking — softmax values,
stable ascending sort, flipped — full-resolution pixel masks, masked full forwards)."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.model.reference import reference_forward
from sopfast.testing import make_hf_vit, make_timm_vit

ATOL = 1e-5
FACTORIES = {"hf_vit": make_hf_vit, "timm_vit": make_timm_vit}


def _model(family: str, image_size: int = 32, **config) -> sopfast.SOP:
    torch.manual_seed(0)
    model = sopfast.SOP(
        FACTORIES[family](image_size=image_size), recipe="paper", mode="exact", group_batch_size=5, **config
    )
    return model.eval()


def _assert_same(fast, ref, atol=ATOL):
    assert torch.equal(fast.group_masks, ref.group_masks)
    torch.testing.assert_close(fast.lam, ref.lam, atol=atol, rtol=0)
    torch.testing.assert_close(fast.group_logits, ref.group_logits, atol=atol, rtol=0)
    torch.testing.assert_close(fast.logits, ref.logits, atol=atol, rtol=0)


def _fewer_nonzero_than_k(out, k: int) -> int:
    """How many groups had fewer than ``k`` non-zero attention values (saturated rows)."""
    return int(((out.attention > 0).sum(-1) < k).sum())


@pytest.mark.parametrize("family", list(FACTORIES))
@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("blur", [0, 3])
@pytest.mark.parametrize("deletion", [False, True])
def test_saturated_softmax_matches_the_authors(family, heads, blur, deletion):
    """γ = 1e4: most attention underflows to exactly 0, so the tie rule decides most of each group."""
    model = _model(
        family, num_groups=6, tau=0.5, num_heads=heads, group_gen_scale=1e4, blur_kernel_size=blur, deletion=deletion
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fast, ref = model(x), reference_forward(model, x)
    assert _fewer_nonzero_than_k(ref, 8) > 0
    _assert_same(fast, ref)


@pytest.mark.parametrize("family", list(FACTORIES))
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_uniform_attention_keeps_the_highest_indices(family, heads):
    """Zero generator weights: every row is uniform; the authors keep the last k patches."""
    model = _model(family, num_groups=4, tau=0.2, num_heads=heads)
    with torch.no_grad():
        for w in model.generator.heads:
            w.zero_()
        x = torch.randn(2, 3, 32, 32)
        fast, ref = model(x), reference_forward(model, x)
    _assert_same(fast, ref)
    assert fast.group_indices[0, 0].tolist() == [13, 14, 15]  # d = 16, k = 3
    model.generator.ties = "logits"
    with torch.no_grad():
        assert model(x).group_indices[0, 0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("family", list(FACTORIES))
def test_logits_tie_rule_matches_its_reference(family):
    model = _model(family, num_groups=5, tau=0.3, num_heads=2, group_gen_scale=1e4, ties="logits")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        _assert_same(model(x), reference_forward(model, x))


@pytest.mark.parametrize("family", list(FACTORIES))
def test_saturated_gradients_match_the_authors(family):
    model = _model(family, num_groups=4, tau=0.25, num_heads=2, group_gen_scale=50.0, blur_kernel_size=3)
    model.train()
    model.epoch = 1
    x, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 2])
    fast, ref = model(x), reference_forward(model, x)
    _assert_same(fast, ref)
    params = model.trainable_parameters()
    g_fast = torch.autograd.grad(fast.loss(labels), params, allow_unused=True)
    g_ref = torch.autograd.grad(ref.loss(labels), params, allow_unused=True)
    for p, a, b in zip(params, g_fast, g_ref):
        torch.testing.assert_close(
            torch.zeros_like(p) if a is None else a, torch.zeros_like(p) if b is None else b, atol=1e-5, rtol=1e-4
        )
    head0 = next(i for i, p in enumerate(params) if p is model.generator.heads[0])
    assert g_fast[head0] is None  # epoch 1 trains head 1 only


@pytest.mark.parametrize("family", list(FACTORIES))
def test_image_side_not_a_multiple_of_the_patch(family):
    """36 px with 8-px patches: 4×4 patches, and the authors' pixel mask (nearest) straddles them."""
    model = _model(family, image_size=36, num_groups=5, tau=0.25, num_heads=2, blur_kernel_size=3)
    assert not model.adapter.patch_aligned
    x = torch.randn(2, 3, 36, 36)
    with torch.no_grad():
        _assert_same(model(x), reference_forward(model, x))


def test_eval_stacks_heads_and_training_uses_one():
    model = _model("hf_vit", num_groups=8, tau=0.25, num_heads=2)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        stacked = model(x).group_masks
        model.train()
        per_head = []
        for epoch in (0, 1):
            model.epoch = epoch
            per_head.append(model(x).group_masks)
    # evaluation keeps rows floor(j·2·16/8) = 0, 4, ..., 28 of the 32 stacked rows: head 0's rows 0, 4, 8, 12 and
    # head 1's rows 0, 4, 8, 12; training with m = 8 keeps rows floor(j·16/8) = 0, 2, ..., 14 of one head
    assert torch.equal(stacked[0, :4], per_head[0][0, ::2]) and torch.equal(stacked[0, 4:], per_head[1][0, ::2])
