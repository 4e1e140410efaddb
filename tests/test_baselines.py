"""sopfast.baselines: self-attributing baselines on SOP's masked-inference path."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.evaluation import baselines as B
from sopfast.evaluation import metrics as M
from sopfast.evaluation.evaluate import evaluate
from sopfast.testing import make_bert, make_cnn, make_hf_vit, make_timm_vit, text_batch


@pytest.fixture(scope="module")
def vit_model():
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25).eval()


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))


def _pixel_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[B, 16]`` patch mask of the 32×32 / 8-pixel test ViT → ``[B, 1, 32, 32]``."""
    return mask.view(-1, 4, 4).repeat_interleave(8, 1).repeat_interleave(8, 2).unsqueeze(1)


def _backbone(model, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.backbone(pixel_values=pixels).logits


def test_top_tau_masks_keeps_top_k_valid_features_ties_to_lower_index():
    scores = torch.tensor([[[0.1, 0.5, 0.5, 0.2, 0.9]]])
    everything = torch.ones(1, 5, dtype=torch.bool)
    assert B.top_tau_masks(scores, everything, 0.4)[0, 0].tolist() == [False, True, False, False, True]
    assert B.top_tau_masks(scores, everything, 0.4, largest=False)[0, 0].tolist() == [True, False, False, True, False]
    valid = torch.tensor([[True, False, True, True, True]])
    assert B.top_tau_masks(scores, valid, 0.5)[0, 0].tolist() == [False, False, True, False, True]


def test_f_baseline_predicts_with_the_backbone_on_one_group(vit_model, x):
    scores = torch.arange(16.0).repeat(2, 1)
    method = B.AttributionBaseline("fixed", lambda model, inputs, target: scores)
    inputs = vit_model.prepare(x)
    pred = method.predict(vit_model, inputs, method.prepare(vit_model, inputs, "exact"), 0.25, True, "exact")
    keep = torch.zeros(2, 16, dtype=torch.bool)
    keep[:, 12:] = True
    assert torch.equal(pred.group_masks[:, 0], keep)
    torch.testing.assert_close(pred.logits, _backbone(vit_model, x * _pixel_mask(keep)), atol=1e-5, rtol=0)
    torch.testing.assert_close(pred.attributions.sum(-1), pred.logits)


def test_run_masks_runs_unequal_groups_in_drop_mode_each_at_its_size(vit_model, x):
    masks = torch.zeros(2, 2, 16, dtype=torch.bool)
    masks[:, 0, :2] = True
    masks[:, 1, 5:8] = True
    inputs = vit_model.prepare(x)
    drop = B.run_masks(vit_model, inputs, masks, "drop").logits
    for j in range(2):  # each size alone is a plain equal-size drop pass
        alone = B.run_masks(vit_model, inputs, masks[:, j : j + 1], "drop").logits[:, 0]
        torch.testing.assert_close(drop[:, j], alone, atol=1e-6, rtol=0)
    exact = B.run_masks(vit_model, inputs, masks, "exact").logits
    torch.testing.assert_close(exact[:, 1], _backbone(vit_model, x * _pixel_mask(masks[:, 1])), atol=1e-5, rtol=0)


def test_gradient_x_input_is_the_pixel_gradient_times_input_pooled_per_patch(vit_model, x):
    target = torch.tensor([0, 2])
    ours = B.gradient_x_input(vit_model, vit_model.prepare(x), target)
    pixels = x.clone().requires_grad_(True)
    logits = vit_model.backbone(pixel_values=pixels).logits
    (grad,) = torch.autograd.grad(logits.gather(1, target.view(-1, 1)).sum(), pixels)
    pooled = (pixels * grad).sum(1).view(2, 4, 8, 4, 8).sum((2, 4)).flatten(1)
    torch.testing.assert_close(ours, pooled.detach(), atol=1e-5, rtol=1e-4)


def test_grad_cam_on_vit_tokens_entering_the_last_block(vit_model, x):
    target = torch.tensor([1, 1])
    ours = B.grad_cam(vit_model, vit_model.prepare(x), target)
    out = vit_model.backbone(pixel_values=x.clone().requires_grad_(True), output_hidden_states=True)
    tokens = out.hidden_states[-2]
    (grad,) = torch.autograd.grad(out.logits[:, 1].sum(), tokens)
    expected = torch.relu((tokens[:, 1:] * grad[:, 1:].mean(1, keepdim=True)).sum(-1))
    torch.testing.assert_close(ours, expected.detach(), atol=1e-5, rtol=1e-4)
    assert bool((ours >= 0).all())


def test_grad_cam_on_cnn_matches_captum_layer_grad_cam():
    captum_attr = pytest.importorskip("captum.attr")
    torch.manual_seed(0)
    model = sopfast.SOP(make_cnn(), num_groups=3, feature_layer="features").eval()
    x = torch.randn(2, 3, 16, 16)
    target = torch.tensor([2, 0])
    ours = B.grad_cam(model, model.prepare(x), target)
    theirs = captum_attr.LayerGradCam(model.backbone, model.backbone.features).attribute(
        x, target=target, relu_attributions=True
    )
    torch.testing.assert_close(ours, theirs.flatten(1).detach(), atol=1e-6, rtol=1e-4)


def test_cls_attention_hf_vit_matches_a_manual_softmax_and_restores_sdpa(vit_model, x):
    ours = B.cls_attention(vit_model, vit_model.prepare(x))
    assert vit_model.backbone.config._attn_implementation == "sdpa"
    with torch.no_grad():
        h = vit_model.backbone(pixel_values=x, output_hidden_states=True).hidden_states[-2]
        layer = vit_model.backbone.vit.layers[-1]
        n = layer.layernorm_before(h)
        heads = vit_model.backbone.config.num_attention_heads
        q = layer.attention.q_proj(n).view(2, 17, heads, -1).transpose(1, 2)
        k = layer.attention.k_proj(n).view(2, 17, heads, -1).transpose(1, 2)
        attn = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1)
    torch.testing.assert_close(ours, attn[:, :, 0, 1:].mean(1), atol=1e-5, rtol=1e-4)


def test_cls_attention_timm_matches_the_unfused_attention():
    torch.manual_seed(0)
    model = sopfast.SOP(make_timm_vit(), num_groups=4, tau=0.25).eval()
    x = torch.randn(2, 3, 32, 32)
    ours = B.cls_attention(model, model.prepare(x))
    attn = model.backbone.blocks[-1].attn
    seen = []
    attn.fused_attn = False
    handle = attn.attn_drop.register_forward_hook(lambda _m, _a, out: seen.append(out))
    try:
        with torch.no_grad():
            model.backbone(x)
    finally:
        handle.remove()
    torch.testing.assert_close(ours, seen[0][:, :, 0, 1:].mean(1), atol=1e-6, rtol=1e-4)


def test_fresh_needs_a_cls_token_unless_it_uses_the_generator():
    torch.manual_seed(0)
    model = sopfast.SOP(make_cnn(), num_groups=3, feature_layer="features").eval()
    inputs = model.prepare(torch.randn(2, 3, 16, 16))
    with pytest.raises(ValueError, match="needs a Transformer with a CLS token"):
        B.Fresh(source="cls").scores(model, inputs)
    with torch.no_grad():
        expected = model.make_groups(inputs).attention.mean(1, keepdim=True)
    torch.testing.assert_close(B.Fresh().scores(model, inputs), expected)


def test_patch_grid_averages_fixed_patches_and_keeps_the_top_ones(vit_model, x):
    inputs = vit_model.prepare(x)
    ids, m = B.patch_ids(vit_model, inputs, None, 4)
    assert m == 4 and ids[0].view(4, 4).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    method = B.PatchGrid(max_groups=4)
    state = method.prepare(vit_model, inputs, "exact")
    y = torch.stack([_backbone(vit_model, x * _pixel_mask(ids == p)) for p in range(4)], 1)
    full = method.predict(vit_model, inputs, state, None, None, "exact")
    torch.testing.assert_close(full.logits, y.mean(1), atol=1e-5, rtol=0)
    top = method.predict(vit_model, inputs, state, 0.25, True, "exact")
    pred = y.mean(1).argmax(-1)
    best = (y[torch.arange(2), :, pred]).argmax(-1)
    torch.testing.assert_close(top.logits, y[torch.arange(2), best] / 4, atol=1e-5, rtol=0)
    assert top.used.sum(-1).eq(1).all()


def test_patch_grid_text_uses_contiguous_candidate_spans():
    torch.manual_seed(0)
    model = sopfast.SOP(make_bert(), num_groups=3, tau=0.3, recipe="paper").eval()  # [CLS]/[SEP] are candidates
    ids, m = B.patch_ids(model, model.prepare(*text_batch()), None, 4)
    assert m == 4
    assert ids[1].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1]


def test_random_groups_have_k_features_are_seeded_and_faithful(vit_model, x):
    inputs = vit_model.prepare(x)
    a, b = B.RandomGroups(seed=3), B.RandomGroups(seed=3)
    pred = a.predict(vit_model, inputs, a.prepare(vit_model, inputs, "exact"), None, None, "exact")
    again = b.predict(vit_model, inputs, b.prepare(vit_model, inputs, "exact"), None, None, "exact")
    assert pred.group_masks.shape == (2, 4, 16) and pred.group_masks.sum(-1).eq(4).all()
    assert torch.equal(pred.group_masks, again.group_masks)
    assert float(M.fidelity(pred.logits, pred.attributions)) < 1e-6


def test_regression_f_baseline_gives_each_output_its_own_group():
    torch.manual_seed(0)
    model = sopfast.SOP(make_cnn(num_classes=2), num_groups=3, task="regression", feature_layer="features").eval()
    inputs = model.prepare(torch.randn(2, 3, 16, 16))
    method = B.make_baseline("gxi-f")
    state = method.prepare(model, inputs, "exact")
    pred = method.predict(model, inputs, state, 0.25, True, "exact")
    assert state.shape == (2, 2, 64)
    assert torch.equal(pred.used, torch.eye(2, dtype=torch.bool).expand(2, 2, 2))
    y = B.run_masks(model, inputs, pred.group_masks, "exact").logits
    torch.testing.assert_close(pred.logits, torch.stack([y[:, 0, 0], y[:, 1, 1]], 1))


@pytest.mark.parametrize("family", ["vit", "cnn", "bert"])
def test_soft_forward_at_full_presence_is_the_backbone(family):
    torch.manual_seed(0)
    if family == "bert":
        model = sopfast.SOP(make_bert(), num_groups=3).eval()
        inputs = model.prepare(*text_batch())
    elif family == "cnn":
        model = sopfast.SOP(make_cnn(), num_groups=3, feature_layer="features").eval()
        inputs = model.prepare(torch.randn(2, 3, 16, 16))
    else:
        model = sopfast.SOP(make_hf_vit(), num_groups=3).eval()
        inputs = model.prepare(torch.randn(2, 3, 32, 32))
    z = torch.ones(inputs.batch_size, model.adapter.num_features(inputs))
    with torch.no_grad():
        torch.testing.assert_close(
            B.soft_forward(model, inputs, z), B.backbone_logits(model, inputs), atol=1e-5, rtol=0
        )


def test_integrated_gradients_are_complete():
    pytest.importorskip("captum")
    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=3).eval()
    inputs = model.prepare(torch.randn(2, 3, 32, 32))
    target = torch.tensor([0, 1])
    attr = B.captum_attribution("ig")(model, inputs, target)
    with torch.no_grad():
        ends = [
            B.soft_forward(model, inputs, torch.full((2, 16), v)).gather(1, target.view(-1, 1))[:, 0]
            for v in (1.0, 0.0)
        ]
    torch.testing.assert_close(attr.sum(-1), ends[0] - ends[1], atol=2e-3, rtol=1e-2)


def test_occlusion_is_the_drop_in_logit_when_a_feature_is_blanked(vit_model, x):
    pytest.importorskip("captum")
    inputs = vit_model.prepare(x)
    target = torch.tensor([2, 2])
    attr = B.captum_attribution("occlusion")(vit_model, inputs, target)
    masks = torch.ones(2, 2, 16, dtype=torch.bool)
    masks[:, 1, 5] = False
    y = B.run_masks(vit_model, inputs, masks, "exact").logits[:, :, 2]
    torch.testing.assert_close(attr[:, 5], y[:, 0] - y[:, 1], atol=1e-5, rtol=0)


def test_masked_attributions_explain_the_backbone_whatever_mode_the_groups_run_in(vit_model, x):
    """The -F attributions of a ViT perturb in exact mode (the backbone's own function) even when the
    evaluation scores groups in drop; ``mode="drop"`` is the faster, different one."""
    pytest.importorskip("captum")
    inputs = vit_model.prepare(x)
    target = torch.tensor([2, 0])
    faithful = B.captum_attribution("occlusion")(vit_model, inputs, target, "drop")
    torch.testing.assert_close(faithful, B.captum_attribution("occlusion", mode="exact")(vit_model, inputs, target))
    with pytest.warns(sopfast.masking.UnfaithfulModeWarning):
        fast = B.captum_attribution("occlusion", mode="drop")(vit_model, inputs, target)
    assert not torch.allclose(faithful, fast)
    rise_exact = B.rise_attribution(num_masks=8)(vit_model, inputs, target, "drop")
    torch.testing.assert_close(rise_exact, B.rise_attribution(num_masks=8, mode="exact")(vit_model, inputs, target))
    assert isinstance(B.make_baseline("occlusion-f", mode="drop"), B.AttributionBaseline)


@pytest.mark.parametrize("method", ["lime", "kernelshap"])
def test_perturbation_methods_use_the_forward_budget(vit_model, x, method, monkeypatch):
    pytest.importorskip("captum")
    pytest.importorskip("sklearn")
    rows = []
    run = sopfast.masking.captum.run_masked
    monkeypatch.setattr(
        sopfast.masking.captum, "run_masked", lambda a, i, e, m, *r: rows.append(len(m)) or run(a, i, e, m, *r)
    )
    attr = B.captum_attribution(method, budget=7)(vit_model, vit_model.prepare(x), torch.tensor([0, 1]))
    assert attr.shape == (2, 16) and bool(torch.isfinite(attr).all())
    assert sum(rows) == 2 + 2 * 7  # the unperturbed inputs once (Captum checks the output), then the budget


def test_baselines_run_through_evaluate_with_zero_fidelity(vit_model, x):
    names = [n for n in B.available_baselines() if n not in ("ig-f", "occlusion-f", "lime-f", "kernelshap-f")]
    res = evaluate(
        vit_model,
        [(x, torch.tensor([0, 1]))],
        metrics=["accuracy", "fidelity", "insertion"],
        baselines=names,
        progress=False,
    )
    assert set(res) == {"SOP", "GxI-F", "GradCAM-F", "FRESH", "Random", "PatchGrid", "RISE-F", "Backbone"}
    assert set(res["Backbone"]) == {"examples", "accuracy"}  # the backbone alone: accuracy only
    assert all(r["fidelity"] < 1e-6 and r["insertion"] > 0 for n, r in res.items() if n != "Backbone")


def test_registry_and_argument_errors(monkeypatch):
    assert {"gxi-f", "gradcam-f", "fresh", "random", "patches"} <= set(B.available_baselines())
    assert B.make_baseline("GxI-F").name == "GxI-F"
    with pytest.raises(ValueError, match="unknown baseline 'shap'"):
        B.make_baseline("shap")
    with pytest.raises(ValueError, match="patch_size must be an integer ≥ 1 or None, got 0"):
        B.PatchGrid(patch_size=0)
    with pytest.raises(ValueError, match="combine must be 'mean' or 'selector'"):
        B.RandomGroups(combine="sum")
    with pytest.raises(ValueError, match="source must be one of"):
        B.Fresh(source="attention")
    with pytest.raises(ValueError, match="method must be one of"):
        B.captum_attribution("rise")
    with pytest.raises(ValueError, match="budget must be an integer ≥ 1"):
        B.captum_attribution("ig", budget=0)
    monkeypatch.setattr(B, "captum_available", lambda method="ig": False)
    monkeypatch.setattr("sopfast.evaluation.attributions.captum_available", lambda method="ig": False)
    assert "ig-f" not in B.available_baselines()
    with pytest.raises(ImportError, match="pip install captum"):
        B.make_baseline("ig-f")


def test_registered_user_adapter_gets_grad_cam_and_fresh_or_clear_errors():
    """A user's adapter registered with register_adapter: the hooks it implements drive Grad-CAM and
    FRESH; the ones it lacks are errors that name the hook."""
    from sopfast.adapters import HFViTAdapter, register_adapter
    from sopfast.adapters.base import AdapterHookMissing
    from sopfast.adapters.registry import _REGISTERED as registry

    class MyViT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = make_hf_vit()

        def forward(self, pixel_values, **kwargs):
            return self.inner(pixel_values=pixel_values, **kwargs)

    class MyAdapter(HFViTAdapter):
        """The HF ViT adapter reached through a wrapper; Grad-CAM and FRESH come from its hooks."""

        def __init__(self, backbone):
            super().__init__(backbone.inner)

    class Bare(MyAdapter):
        """Without the optional hooks."""

        def cam_layer(self):
            raise AdapterHookMissing(self, "cam_layer", "Grad-CAM")

        has_cls_attention = False

    x = torch.randn(2, 3, 32, 32)
    register_adapter(lambda m: isinstance(m, MyViT), MyAdapter)
    try:
        model = sopfast.SOP(MyViT(), num_groups=4)
        assert isinstance(model.adapter, MyAdapter)
        inputs = model.prepare(x)
        target = torch.tensor([0, 1])
        cam = B.grad_cam(model, inputs, target)
        assert cam.shape == (2, 16) and (cam >= 0).all()
        fresh = B.make_baseline("fresh").scores(model, inputs)
        assert fresh.shape == (2, 1, 16)
        torch.testing.assert_close(fresh[:, 0], model.adapter.cls_attention(inputs))
        bare = sopfast.SOP(MyViT(), num_groups=4, adapter=Bare(MyViT()))
        with pytest.raises(NotImplementedError, match=r"Bare does not implement BackboneAdapter.cam_layer\(\)"):
            B.grad_cam(bare, bare.prepare(x), target)
        with pytest.raises(ValueError, match="has no cls_attention"):
            B.cls_attention(bare, bare.prepare(x))
        assert B.make_baseline("fresh").scores(bare, bare.prepare(x)).shape == (2, 1, 16)  # auto → generator
    finally:
        registry.pop(0)
