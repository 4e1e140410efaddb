"""Bad input gets a clear error naming the argument, the value and what is allowed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sopfast
from sopfast.model.recipes import RECIPE_OPTIONS, RECIPES, resolve_options
from sopfast.testing import make_cnn, make_hf_vit, text_batch


@pytest.mark.parametrize("tau", [0.0, -0.1, 1.5])
def test_tau_out_of_range(hf_vit, tau):
    with pytest.raises(ValueError, match=r"tau must lie in \(0, 1\]"):
        sopfast.SOP(hf_vit, tau=tau)


def test_tau_out_of_range_at_inference(hf_vit):
    model = sopfast.SOP(hf_vit, num_groups=4)
    with pytest.raises(ValueError, match="tau must lie in"):
        model(torch.randn(1, 3, 32, 32), tau=2.0)


@pytest.mark.parametrize("m", [0, -3])
def test_num_groups_below_one(hf_vit, m):
    with pytest.raises(ValueError, match="num_groups must be an integer ≥ 1"):
        sopfast.SOP(hf_vit, num_groups=m)


def test_more_groups_than_features_repeat_query_rows(hf_vit):
    """As in the authors' code, rows floor(j·d/m) repeat when m > d: no error, repeated groups."""
    model = sopfast.SOP(hf_vit, num_groups=20, recipe="paper").eval()  # d = 16 patches, fixed query rows
    with torch.no_grad():
        out = model(torch.randn(1, 3, 32, 32))
    rows = [j * 16 // 20 for j in range(20)]
    assert out.group_masks.shape == (1, 20, 16)
    for j in range(19):
        assert torch.equal(out.group_masks[0, j], out.group_masks[0, j + 1]) == (rows[j] == rows[j + 1])


def test_one_short_example_does_not_fail_the_batch(bert):
    """A batch holding one example with fewer candidates than groups runs; that example repeats rows."""
    model = sopfast.SOP(bert, num_groups=9).eval()
    ids, mask, types = text_batch()  # candidates: 10, 8 and 8 tokens
    with torch.no_grad():
        out = model(ids, mask, types)
    assert out.logits.shape[0] == 3 and torch.isfinite(out.logits).all()
    masks = out.group_masks[2]
    assert len({tuple(m.tolist()) for m in masks}) <= 8


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.randn(3, 32, 32), r"\[B, C, H, W\]"),
        (torch.randn(1, 1, 32, 32), "must have 3 channels"),
        (torch.randn(1, 3, 24, 24), "must be 32x32 pixels"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), "floating tensor"),
    ],
)
def test_bad_images(hf_vit, x, match):
    model = sopfast.SOP(hf_vit, num_groups=4)
    with pytest.raises((ValueError, TypeError), match=match):
        model(x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_images(hf_vit, bad):
    x = torch.randn(1, 3, 32, 32)
    x[0, 0, 0, 0] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        sopfast.SOP(hf_vit, num_groups=4)(x)


def test_text_without_attention_mask(bert):
    ids, _, _ = text_batch()
    with pytest.raises(ValueError, match="need attention_mask"):
        sopfast.SOP(bert, num_groups=3)(ids)


def test_text_with_float_ids(bert):
    ids, mask, _ = text_batch()
    with pytest.raises(TypeError, match="input_ids must be int64"):
        sopfast.SOP(bert, num_groups=3)(ids.float(), mask)


def test_unsupported_backbone_points_to_adapter_protocol():
    with pytest.raises(TypeError, match="BackboneAdapter"):
        sopfast.SOP(nn.Sequential(nn.Linear(4, 4)))


def test_not_a_module():
    with pytest.raises(TypeError, match=r"must be a torch\.nn\.Module"):
        sopfast.SOP("vit-base")


def test_cnn_without_classifier():
    body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    with pytest.raises(ValueError, match="class_weights"):
        sopfast.SOP(body, feature_layer="2")


def test_cnn_without_linear_uses_pooled_features_as_keys():
    body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    model = sopfast.SOP(body, num_groups=2, feature_layer="0", class_weights=torch.randn(4, 4))
    assert model(torch.randn(1, 3, 8, 8)).logits.shape == (1, 4)


def test_cnn_with_class_weights_override():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Conv2d(3, 4, 3, padding=1)
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.features(x).mean(dim=(2, 3)))

    model = sopfast.SOP(Head(), num_groups=2, feature_layer="features", class_weights=torch.randn(2, 4))
    assert model(torch.randn(1, 3, 8, 8)).logits.shape == (1, 2)


def test_cnn_needs_feature_layer(cnn):
    with pytest.raises(ValueError, match="feature_layer"):
        sopfast.SOP(cnn)


def test_cnn_unknown_feature_layer(cnn):
    with pytest.raises(ValueError, match="'nope' is not a module"):
        sopfast.SOP(cnn, feature_layer="nope")


def test_drop_mode_unsupported_for_cnn():
    with pytest.raises(ValueError, match="mode='drop' is not supported by CNNAdapter"):
        sopfast.SOP(make_cnn(), feature_layer="features", mode="drop")


def test_vit_drop_rejects_groups_of_different_sizes(hf_vit):
    from sopfast.types import Groups

    model = sopfast.SOP(hf_vit, num_groups=2, mode="drop")
    inputs = model.prepare(torch.randn(1, 3, 32, 32))
    mask = torch.zeros(1, 2, 16, dtype=torch.bool)
    mask[0, 0, :3] = True
    mask[0, 1, :2] = True
    indices = torch.tensor([[[0, 1, 2], [0, 1, -1]]])
    groups = Groups(mask, indices, torch.zeros(1, 2), mask.float())
    with pytest.raises(ValueError, match="groups of equal size"):
        model.predict_groups(inputs, groups)
    assert model.predict_groups(inputs, groups, mode="exact").logits.shape == (1, 3)


def test_unknown_mode(hf_vit):
    with pytest.raises(ValueError, match="mode must be one of"):
        sopfast.SOP(hf_vit, mode="fast")


def test_unknown_task(hf_vit):
    with pytest.raises(ValueError, match="task must be one of"):
        sopfast.SOP(hf_vit, task="ranking")


def test_heads_are_full_width_and_need_not_divide_embedding(hf_vit):
    model = sopfast.SOP(hf_vit, num_heads=3)  # E = 32
    assert [tuple(w.shape) for w in model.generator.heads] == [(96, 32)] * 3
    with pytest.raises(ValueError, match="num_heads must be an integer ≥ 1"):
        sopfast.SOP(hf_vit, num_heads=0)


def test_blur_too_large_for_grid(hf_vit):
    model = sopfast.SOP(hf_vit, num_groups=4, blur_kernel_size=9)
    with pytest.raises(ValueError, match="blur kernel_size 9 is too large"):
        model(torch.randn(1, 3, 32, 32))


def test_even_blur_kernel(hf_vit):
    model = sopfast.SOP(hf_vit, num_groups=4, blur_kernel_size=2)
    with pytest.raises(ValueError, match="positive odd integer"):
        model(torch.randn(1, 3, 32, 32))


def test_two_inputs_at_once(hf_vit):
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="exactly one input"):
        sopfast.SOP(hf_vit, num_groups=4)(x, pixel_values=x)


def test_regression_target_shape():
    model = sopfast.SOP(make_hf_vit(num_labels=2), num_groups=4, task="regression")
    out = model(torch.randn(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"targets must have shape \[B, 2\]"):
        out.loss(torch.randn(2, 3))


def test_classification_label_shape(bert):
    ids, mask, types = text_batch()
    out = sopfast.SOP(bert, num_groups=3)(ids, mask, types)
    with pytest.raises(ValueError, match=r"labels must have shape \[B\]"):
        out.loss(torch.zeros(3, 2, dtype=torch.long))


def test_custom_adapter_protocol_is_usable():
    """A user's own adapter, built on the documented protocol, drives SOP end to end."""
    from sopfast.adapters import BackboneAdapter
    from sopfast.types import FeatureInputs, GroupPredictions

    class Tabular(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(1, 8)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.embed(x.unsqueeze(-1)).mean(1))

    class TabularAdapter(BackboneAdapter):
        def prepare(self, x, attention_mask=None, token_type_ids=None):
            return FeatureInputs(pixels=x)

        def num_features(self, inputs):
            return inputs.pixels.shape[1]

        @property
        def embed_dim(self):
            return 8

        def embed(self, projection, inputs):
            return projection.embed(inputs.pixels.unsqueeze(-1))

        def run_groups(self, inputs, groups, mode, chunk_size):
            b, m, d = groups.mask.shape
            masked = inputs.pixels.unsqueeze(1) * groups.mask
            logits, keys = self.full_forward(FeatureInputs(pixels=masked.reshape(b * m, d)))
            return GroupPredictions(logits.view(b, m, -1), keys.view(b, m, -1))

        def full_forward(self, inputs):
            h = self.backbone.embed(inputs.pixels.unsqueeze(-1)).mean(1)
            return self.backbone.head(h), h

        def classifier_weight(self):
            return self.backbone.head.weight

    net = Tabular()
    model = sopfast.SOP(net, num_groups=3, tau=0.5, adapter=TabularAdapter(net))
    out = model(torch.randn(4, 6))
    assert out.logits.shape == (4, 2) and out.group_masks.sum(-1).eq(3).all()
    assert model.saliency_weight == 0.0  # the default recipe's saliency teacher needs soft_forward
    with pytest.raises(ValueError, match="saliency_weight > 0 needs the adapter's soft_forward"):
        sopfast.SOP(net, num_groups=3, tau=0.5, adapter=TabularAdapter(net), saliency_weight=1.0)


@pytest.mark.parametrize("family", ["hf_vit", "timm_vit", "cnn", "bert"])
def test_empty_batch_gives_empty_outputs_and_zero_loss(family, request):
    backbone = request.getfixturevalue(family)
    kwargs = {"feature_layer": "features"} if family == "cnn" else {}
    model = sopfast.SOP(backbone, num_groups=4, **kwargs)
    if family == "bert":
        ids, mask, types = text_batch()
        args = (ids[:0], mask[:0], types[:0])
    else:
        size = 16 if family == "cnn" else 32
        args = (torch.randn(0, 3, size, size),)
    for mode in model.adapter.supported_modes:
        out = model(*args, mode=mode)
        assert out.logits.shape == (0, model.num_classes) and out.group_masks.shape[:2] == (0, 4)
        assert out.group_scores.shape == (0, model.num_classes, 4) and out.lam.shape == (0, 4)
        loss = out.loss(torch.zeros(0, dtype=torch.long))
        assert loss.item() == 0.0


@pytest.mark.parametrize("family", ["hf_vit", "timm_vit", "cnn"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_half_and_double_images_run_in_the_backbone_dtype(family, dtype, request):
    kwargs = {"feature_layer": "features"} if family == "cnn" else {}
    model = sopfast.SOP(request.getfixturevalue(family), num_groups=4, **kwargs).eval()
    x = torch.randn(2, 3, *((16, 16) if family == "cnn" else (32, 32)))
    with torch.no_grad():
        expected = model(x).logits
        torch.testing.assert_close(
            model(x.to(dtype)).logits, expected, atol=5e-3 if dtype == torch.float16 else 1e-5, rtol=0
        )


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda ids, mask, types: (ids + 1000, mask, types), r"input_ids must lie in \[0, 59\]"),
        (lambda ids, mask, types: (ids, mask, types * 5), r"token_type_ids must lie in \[0, 1\]"),
        (lambda ids, mask, types: tuple(t.repeat(1, 5) for t in (ids, mask, types)), "at most 64 tokens .* got 70"),
    ],
)
def test_text_outside_the_embedding_tables(bert, edit, match):
    with pytest.raises(ValueError, match=match):
        sopfast.SOP(bert, num_groups=3)(*edit(*text_batch()))


def test_non_finite_scales_and_overflowing_inputs(hf_vit):
    for name in ("group_gen_scale", "group_sel_scale"):
        for value in (float("nan"), float("inf"), 0.0, -1.0):
            with pytest.raises(ValueError, match=rf"{name} must be a finite number > 0\.0, got {value}"):
                sopfast.SOP(hf_vit, **{name: value})
    with pytest.raises(ValueError, match="the generator's attention is not finite"):
        sopfast.SOP(hf_vit, num_groups=4)(torch.randn(1, 3, 32, 32) * 1e30)


def test_labels_outside_the_classes(hf_vit):
    out = sopfast.SOP(hf_vit, num_groups=4)(torch.randn(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\]"):
        out.loss(torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="labels must be integer class ids"):
        out.loss(torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize(
    "name",
    [
        "deletion",
        "center_embeddings",
        "normalize_logits",
        "freeze_projection",
        "key_score",
        "unit_lambda",
        "demote_blank",
        "keep_special_tokens",
    ],
)
@pytest.mark.parametrize("value", ["yes", 1, None, torch.tensor(True)])
def test_switches_take_only_booleans(hf_vit, name, value):
    if value is None and name in RECIPE_OPTIONS:  # None: the recipe's value (for this backbone)
        model = sopfast.SOP(hf_vit, **{name: value})
        assert model.config[name] == resolve_options(RECIPES["sopfast"], {}, model.adapter)[name]
        return
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got"):
        sopfast.SOP(hf_vit, **{name: value})


@pytest.mark.parametrize(
    "weights, error, match",
    [
        (torch.randn(3, 16), ValueError, r"class_weights must have shape \[C, H\] = \[3, 32\] .*got \(3, 16\)"),
        (torch.randn(4, 32), ValueError, r"class_weights must have shape \[C, H\] = \[3, 32\]"),
        (torch.randn(3, 32, 1), ValueError, "class_weights must have shape"),
        (torch.ones(3, 32, dtype=torch.long), TypeError, "class_weights must be a float tensor"),
        ([[0.0] * 32] * 3, TypeError, "class_weights must be a float tensor .* got list"),
        (torch.full((3, 32), float("nan")), ValueError, "class_weights must be finite"),
    ],
)
def test_class_weights_are_checked_when_the_model_is_built(hf_vit, weights, error, match):
    with pytest.raises(error, match=match):
        sopfast.SOP(hf_vit, class_weights=weights)


def test_hugging_face_model_without_head_says_what_is_missing():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32)
    with pytest.raises(TypeError, match=r"ViTModel is a Hugging Face base model without a classifier.*ViTForImage"):
        sopfast.SOP(ViTModel(cfg))


def test_cnn_without_classifier_names_the_key_width():
    body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    with pytest.raises(ValueError, match=r"pass class_weights=\[C, H\] with H = 4"):
        sopfast.SOP(body, feature_layer="2")
