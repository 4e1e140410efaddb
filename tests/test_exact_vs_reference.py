"""``mode="exact"`` equals the authors' algorithm (sopfast.model.reference) on every backbone family."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import sopfast
from sopfast import testing
from sopfast.model.reference import reference_forward
from sopfast.testing import TINY_HF, make_bert, make_cnn, make_hf, make_hf_vit, make_timm_vit, text_batch


def make_torchvision_vit():
    from torchvision.models import VisionTransformer

    vit = VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=3).eval()
    torch.nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zero: all logits 0
    return vit


ATOL = 1e-5

FAMILIES = {
    "hf_vit": (make_hf_vit, {}, lambda: (torch.randn(2, 3, 32, 32),)),
    "timm_vit": (make_timm_vit, {}, lambda: (torch.randn(2, 3, 32, 32),)),
    "cnn": (make_cnn, {"feature_layer": "features"}, lambda: (torch.randn(2, 3, 16, 16),)),
    "bert": (make_bert, {}, lambda: text_batch()),
    "torchvision_vit": (make_torchvision_vit, {}, lambda: (torch.randn(2, 3, 32, 32),)),
}
# every other Hugging Face family, from its tiny config (tests/test_hf_families.py)
FAMILIES.update(
    {
        name: (partial(make_hf, name), {}, (lambda: (torch.randn(2, 3, 32, 32),)) if "Image" in model else text_batch)
        for name, (_, model, _) in TINY_HF.items()
        if name not in ("hf-vit", "hf-bert")
    }
)

CONFIGS = [
    dict(num_groups=5, tau=0.2),
    dict(num_groups=3, tau=0.5, deletion=True),
    dict(num_groups=4, tau=0.25, num_heads=2),
    dict(num_groups=6, tau=0.3, blur_kernel_size=3, blur_sigma=1.0),
    dict(num_groups=1, tau=1.0, group_gen_scale=4.0, group_sel_scale=2.0),
]


def _build(family: str, config: dict, task: str = "classification"):
    factory, adapter_kwargs, inputs = FAMILIES[family]
    torch.manual_seed(0)
    model = sopfast.SOP(
        factory(), recipe="paper", mode="exact", group_batch_size=7, task=task, **config, **adapter_kwargs
    )
    torch.manual_seed(1)
    return model, inputs()


def _call(model, args):
    return model(*args)


def _assert_outputs_match(fast, ref):
    assert torch.equal(fast.group_masks, ref.group_masks)
    assert torch.equal(fast.group_indices, ref.group_indices)
    torch.testing.assert_close(fast.lam, ref.lam, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast.group_logits, ref.group_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast.group_scores, ref.group_scores, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast.logits, ref.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_exact_forward_equals_reference(family, config):
    model, args = _build(family, config)
    model.eval()
    with torch.no_grad():
        _assert_outputs_match(model(*args), reference_forward(model, *args))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_exact_gradients_equal_reference(family, task):
    model, args = _build(family, dict(num_groups=4, tau=0.25, num_heads=2), task=task)
    model.train()
    model.epoch = 1
    labels = torch.tensor([0, 1, 1][: args[0].shape[0]])
    if task == "regression":
        labels = torch.randn(args[0].shape[0], model.num_classes)
    fast = model(*args)
    ref = reference_forward(model, *args)
    _assert_outputs_match(fast, ref)
    params = model.trainable_parameters()
    g_fast = torch.autograd.grad(fast.loss(labels), params, allow_unused=True)
    g_ref = torch.autograd.grad(ref.loss(labels), params, allow_unused=True)
    nonzero = 0
    for p, a, b in zip(params, g_fast, g_ref):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
        nonzero += int(a.abs().sum() > 0)
    assert nonzero >= 3, "gradients must reach the projection, the generator and the selector"


def test_exact_tau_changeable_at_inference(hf_vit):
    model = sopfast.SOP(hf_vit, recipe="paper", num_groups=4, tau=0.25).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model(x, tau=0.5)
        ref = reference_forward(model, x, tau=0.5)
    assert out.group_masks.sum(-1).eq(8).all()
    _assert_outputs_match(out, ref)


def test_group_passes_run_without_autograd(hf_vit, monkeypatch):
    model = sopfast.SOP(hf_vit, recipe="paper", num_groups=4, tau=0.25)
    seen = []
    original = model.adapter._encode

    def spy(tokens):
        seen.append(torch.is_grad_enabled())
        return original(tokens)

    monkeypatch.setattr(model.adapter, "_encode", spy)
    model(torch.randn(2, 3, 32, 32)).logits.sum().backward()
    assert seen and not any(seen)


def test_exact_never_builds_full_resolution_group_masks(cnn):
    """Chunked pixel masking: no [B, m, H, W] (or [B, d, H, W]) float tensor is ever created."""
    b, m, size = 4, 16, 24
    model = sopfast.SOP(cnn, recipe="paper", num_groups=m, tau=0.25, feature_layer="features", group_batch_size=8)
    x = torch.randn(b, 3, size, size)
    shapes = []

    class Recorder(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                shapes.append((tuple(out.shape), out.dtype))
            return out

    with Recorder(), torch.no_grad():
        model(x)
    d = 144
    forbidden = [
        s
        for s, dt in shapes
        if dt.is_floating_point and s[-2:] == (size, size) and (s[0] >= b * m or s[:2] in ((b, m), (b, d)))
    ]
    assert not forbidden, forbidden
    assert any(s[-2:] == (size, size) for s, _ in shapes), "the recorder must see the pixel chunks"


def test_reference_forward_refuses_options_beyond_the_paper():
    model = sopfast.SOP(testing.vit((32, 2, 2), image_size=32, patch_size=8), num_groups=4)  # recipe "sopfast"
    with pytest.raises(ValueError, match=r"uses normalize_logits=True, center_embeddings=True, queries='diverse'"):
        reference_forward(model, torch.zeros(1, 3, 32, 32))
