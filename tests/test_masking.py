"""sopfast.masking: masked_forward against plain backbones, Captum's perturbation explainers on it
(equal to Captum on the plain model in exact mode), RISE against its formula, and bad input."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.masking import MaskedForward, UnfaithfulModeWarning, agreement, masked_forward, rise, rise_masks
from sopfast.masking.agreement import spearman, top_overlap
from sopfast.testing import make_bert, make_cnn, make_hf_vit, text_batch

PATCH = 8  # make_hf_vit: 32 px images in a 4×4 grid of 8 px patches


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    model = make_hf_vit().eval()
    with torch.no_grad():
        model.classifier.weight.mul_(20)  # logits that move when patches go
    return model


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    return make_bert().eval()


@pytest.fixture
def x():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _random_masks(b: int, m: int, d: int, seed: int = 0, keep: float = 0.5) -> torch.Tensor:
    masks = torch.rand(b, m, d, generator=torch.Generator().manual_seed(seed)) < keep
    masks[..., 0] = True  # none empty
    return masks


def _pixels(masks: torch.Tensor) -> torch.Tensor:
    """``[B, d]`` on the 4×4 patch grid → ``[B, 1, 32, 32]`` pixel mask."""
    grid = masks.view(-1, 4, 4).float()
    return grid.repeat_interleave(PATCH, 1).repeat_interleave(PATCH, 2).unsqueeze(1)


def _vit_on_kept_tokens(vit, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """HF ViT's own modules on [CLS] + the kept patch tokens (positions added before dropping)."""
    tokens = vit.vit.embeddings(x)  # [1, 1 + d, E]
    kept = torch.cat([torch.zeros(1, dtype=torch.long), keep.nonzero().squeeze(1) + 1])
    hidden = tokens[:, kept]
    for layer in getattr(vit.vit, "layers", None) or vit.vit.encoder.layer:  # transformers 5.x / 4.x
        hidden = layer(hidden)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return vit.classifier(vit.vit.layernorm(hidden)[:, 0])


def test_exact_is_the_plain_vit_on_blanked_patches(vit, x):
    masks = _random_masks(2, 5, 16)
    out = masked_forward(vit, x, masks, mode="exact")
    assert out.shape == (2, 5, 3)
    for j in range(5):
        plain = vit(pixel_values=x * _pixels(masks[:, j])).logits
        torch.testing.assert_close(out[:, j], plain, atol=1e-5, rtol=0)


@pytest.mark.filterwarnings("ignore::sopfast.masking.UnfaithfulModeWarning")
def test_drop_runs_only_the_kept_tokens_whatever_their_count(vit, x):
    masks = _random_masks(2, 6, 16, seed=3)  # kept counts differ: bucketed by count
    assert len(set(masks.sum(-1).flatten().tolist())) > 2
    out = masked_forward(vit, x, masks, mode="drop")
    with torch.no_grad():
        for b in range(2):
            for j in range(6):
                expected = _vit_on_kept_tokens(vit, x[b : b + 1], masks[b, j])[0]
                torch.testing.assert_close(out[b, j], expected, atol=1e-5, rtol=0)
    # the chunking budget does not change the result
    torch.testing.assert_close(masked_forward(vit, x, masks, mode="drop", tokens_per_call=5), out, atol=1e-6, rtol=0)


def test_bert_drop_equals_exact_and_padding_is_never_kept(bert):
    ids, attention, types = text_batch()
    inputs = {"input_ids": ids, "attention_mask": attention, "token_type_ids": types}
    masks = _random_masks(3, 4, ids.shape[1], seed=5)
    drop = masked_forward(bert, inputs, masks, mode="drop", return_embeddings=True)
    exact = masked_forward(bert, inputs, masks, mode="exact", return_embeddings=True)
    torch.testing.assert_close(drop.logits, exact.logits, atol=1e-5, rtol=0)
    assert drop.embeddings.shape == (3, 4, bert.config.hidden_size)
    padded = masks.clone()
    padded[2, :, 8:] = True  # example 2 has 8 real tokens: the rest is padding
    torch.testing.assert_close(
        masked_forward(bert, inputs, padded), masked_forward(bert, inputs, masks), atol=1e-6, rtol=0
    )


def test_cnn_and_sop_models_and_adapters_are_accepted(x):
    cnn = make_cnn().eval()
    model = sopfast.SOP(cnn, num_groups=2, feature_layer="features")
    inputs = model.prepare(x[:, :, :16, :16])
    d = model.adapter.num_features(inputs)
    masks = _random_masks(2, 3, d)
    through_model = masked_forward(model, x[:, :, :16, :16], masks, mode="exact")
    through_adapter = masked_forward(model.adapter, inputs, masks, mode="exact")
    torch.testing.assert_close(through_model, through_adapter)


def test_empty_masks_are_refused_unless_allowed(vit, x):
    masks = _random_masks(2, 3, 16)
    masks[1, 2] = False
    with pytest.raises(ValueError, match=r"mask 5 \(example 1\) keeps no feature; pass allow_empty=True"):
        masked_forward(vit, x, masks)
    out = masked_forward(vit, x, masks, allow_empty=True)  # the input with every patch blank
    blank = vit(pixel_values=torch.zeros_like(x[1:])).logits
    torch.testing.assert_close(out[1, 2], blank[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("masks", "error", "match"),
    [
        (torch.ones(2, 3, 16), TypeError, "masks must be a bool tensor .* got dtype torch.float32"),
        (torch.ones(2, 3, 15, dtype=torch.bool), ValueError, r"masks must have shape \[B, M, d\] = \[2, M, 16\]"),
        (torch.ones(3, 16, dtype=torch.bool), ValueError, r"got \[3, 16\]"),
        ([[True]], TypeError, "masks must be a bool tensor"),
    ],
)
def test_bad_masks(vit, x, masks, error, match):
    with pytest.raises(error, match=match):
        masked_forward(vit, x, masks)


def test_bad_backbone_mode_and_budget(vit, x):
    masks = _random_masks(2, 1, 16)
    with pytest.raises(TypeError, match="no sopfast adapter for backbone type Linear"):
        masked_forward(torch.nn.Linear(3, 3), x, masks)
    with pytest.raises(TypeError, match=r"backbone must be an nn\.Module"):
        masked_forward("vit", x, masks)
    with pytest.raises(ValueError, match="mode must be one of"):
        masked_forward(vit, x, masks, mode="fast")
    with pytest.raises(ValueError, match="tokens_per_call must be an integer ≥ 1"):
        masked_forward(vit, x, masks, tokens_per_call=0)


# -- Captum ------------------------------------------------------------------------------------------
def _captum_on_plain_vit(vit, x, explainer, **kwargs) -> torch.Tensor:
    """Captum on the plain HF ViT with a patch ``feature_mask`` and baseline 0 → ``[B, d]``."""
    ids = torch.arange(16).view(4, 4).repeat_interleave(PATCH, 0).repeat_interleave(PATCH, 1)
    attributions = explainer(lambda pixels: vit(pixel_values=pixels).logits).attribute(
        x, baselines=0.0, feature_mask=ids.expand(1, 3, 32, 32).contiguous(), **kwargs
    )
    return attributions[:, 0, ::PATCH, ::PATCH].reshape(x.shape[0], 16)


@pytest.mark.parametrize("mode", ["exact", None])
@pytest.mark.parametrize("name", ["FeatureAblation", "KernelShap", "ShapleyValueSampling"])
def test_captum_in_exact_mode_equals_captum_on_the_plain_model(vit, x, name, mode):
    """Explicitly ``exact``, and with no mode at all: a ViT's explainers default to its faithful mode."""
    captum = pytest.importorskip("captum.attr")
    explainer = getattr(captum, name)
    samples = {"KernelShap": {"n_samples": 25}, "ShapleyValueSampling": {"n_samples": 2}}.get(name, {})
    target = torch.tensor([0, 2])
    forward = MaskedForward(vit, x, mode=mode)
    assert forward.mode == "exact"
    torch.manual_seed(0)
    ours = explainer(forward).attribute(
        forward.presence,
        target=target,
        additional_forward_args=forward.example_ids,
        perturbations_per_eval=7,
        **samples,
    )
    torch.manual_seed(0)
    theirs = _captum_on_plain_vit(vit, x, explainer, target=target, **samples)
    assert ours.abs().max() > 1e-3
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_occlusion_and_lime_run_on_the_drop_path(vit, x):
    captum = pytest.importorskip("captum.attr")
    pytest.importorskip("sklearn")
    with pytest.warns(UnfaithfulModeWarning, match="sopfast.masking.agreement"):
        forward = MaskedForward(vit, x, mode="drop")
    target = torch.tensor([1, 0])
    occlusion = captum.Occlusion(forward).attribute(
        forward.presence,
        sliding_window_shapes=(2,),
        strides=2,
        target=target,
        additional_forward_args=forward.example_ids,
    )
    pairs = torch.arange(16) // 2  # occluding windows of 2 features = ablating pairs
    ablation = captum.FeatureAblation(forward).attribute(
        forward.presence, feature_mask=pairs.expand(2, 16), target=target, additional_forward_args=forward.example_ids
    )
    torch.testing.assert_close(occlusion, ablation, atol=1e-5, rtol=0)
    lime = captum.Lime(forward).attribute(
        forward.presence, target=target, additional_forward_args=forward.example_ids, n_samples=20
    )
    assert lime.shape == (2, 16) and bool(torch.isfinite(lime).all())
    heat = forward.to_input(occlusion)
    assert heat.shape == (2, 32, 32) and torch.equal(heat[:, ::PATCH, ::PATCH].reshape(2, 16), occlusion)


def test_captum_on_text_features(bert):
    captum = pytest.importorskip("captum.attr")
    ids, attention, types = text_batch()
    forward = MaskedForward(bert, {"input_ids": ids, "attention_mask": attention, "token_type_ids": types})
    assert torch.equal(forward.presence.bool(), attention.bool() & (types == 0))  # the first segment's tokens
    attr = captum.FeatureAblation(forward).attribute(
        forward.presence, target=torch.tensor([0, 1, 0]), additional_forward_args=forward.example_ids
    )
    assert attr.shape == ids.shape and bool((attr[~forward.presence.bool()] == 0).all())
    assert forward.to_input(attr) is attr


def test_masked_forward_argument_errors(vit, x):
    forward = MaskedForward(vit, x)
    with pytest.raises(ValueError, match=r"presence must be \[N, d\] with d = 16"):
        forward(torch.ones(2, 15), torch.arange(2))
    with pytest.raises(ValueError, match=r"pass additional_forward_args=forward\.example_ids"):
        forward(torch.ones(2, 16), torch.arange(3))


# -- RISE --------------------------------------------------------------------------------------------
def test_rise_masks_are_smooth_random_and_seeded():
    masks = rise_masks(2, (8, 8), 400, 0.5, 4, torch.Generator().manual_seed(0))
    again = rise_masks(2, (8, 8), 400, 0.5, 4, torch.Generator().manual_seed(0))
    assert masks.shape == (2, 400, 64) and masks.dtype == torch.bool and torch.equal(masks, again)
    assert 0.4 < masks.float().mean() < 0.6
    grid = masks.view(800, 8, 8)
    same_as_right = (grid[..., 1:] == grid[..., :-1]).float().mean()
    assert same_as_right > 0.75  # neighbours mostly agree: cells of about 2×2 features, not noise
    text = rise_masks(1, 10, 50, 0.3, 5, torch.Generator().manual_seed(0))
    assert text.shape == (1, 50, 10)


def test_rise_is_its_formula_on_the_plain_model(vit, x):
    target = torch.tensor([2, 1])
    saliency = rise(vit, x, target, num_masks=30, cells=2, mode="exact", seed=4)
    masks = rise_masks(2, (4, 4), 30, 0.5, 2, torch.Generator().manual_seed(4))
    expected = torch.zeros(2, 16)
    with torch.no_grad():
        for j in range(30):
            probs = vit(pixel_values=x * _pixels(masks[:, j])).logits.softmax(-1)
            expected += probs.gather(1, target.view(2, 1)) * masks[:, j].float()
    torch.testing.assert_close(saliency, expected / (30 * 0.5), atol=1e-5, rtol=1e-5)


def test_rise_argument_errors(vit, x):
    with pytest.raises(ValueError, match=r"target must be a \[B\] = \[2\] tensor"):
        rise(vit, x, torch.tensor([1]))
    with pytest.raises(ValueError, match="keep must lie in"):
        rise(vit, x, torch.tensor([1, 0]), keep=0.0)
    with pytest.raises(ValueError, match="num_masks must be an integer ≥ 1"):
        rise(vit, x, torch.tensor([1, 0]), num_masks=0)


def test_probabilities_instead_of_logits(vit, x):
    logits = MaskedForward(vit, x)
    probabilities = MaskedForward(vit, x, probabilities=True)
    rows = torch.ones(2, 16)
    torch.testing.assert_close(probabilities(rows, torch.arange(2)), logits(rows, torch.arange(2)).softmax(-1))


# -- the faithful default mode, and agreement between modes ------------------------------------------
def test_explainers_default_to_the_mode_that_runs_the_backbone_itself(vit, bert, x):
    """A ViT's ``drop`` computes another function: masked_forward / MaskedForward / rise default to
    ``exact`` there, and to ``drop`` for BERT, whose drop equals exact (no warning for either)."""
    import warnings

    masks = _random_masks(2, 3, 16)
    target = torch.tensor([0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfaithfulModeWarning)
        torch.testing.assert_close(masked_forward(vit, x, masks), masked_forward(vit, x, masks, mode="exact"))
        torch.testing.assert_close(
            rise(vit, x, target, num_masks=20, cells=2), rise(vit, x, target, num_masks=20, cells=2, mode="exact")
        )
        ids, attention, _ = text_batch()
        assert MaskedForward(bert, {"input_ids": ids, "attention_mask": attention}).mode == "drop"
        masked_forward(bert, {"input_ids": ids, "attention_mask": attention}, _random_masks(3, 2, 14), mode="drop")
    with pytest.warns(UnfaithfulModeWarning, match="mode='drop' on HFViTAdapter"):
        masked_forward(vit, x, masks, mode="drop")
    with pytest.warns(UnfaithfulModeWarning):
        rise(vit, x, target, num_masks=5, mode="drop")


def test_agreement_is_one_where_drop_is_exact_and_measured_where_not(vit, bert, x):
    ids, attention, _ = text_batch()
    text = agreement(bert, {"input_ids": ids, "attention_mask": attention}, explainer="rise", samples=30)
    assert text.median_spearman == pytest.approx(1.0) and text.mean_top_overlap == 1.0
    image = agreement(vit, x, explainer="rise", samples=30, top=0.25)
    assert image.spearman.shape == (2,) and image.top_overlap.shape == (2,)
    assert bool(((image.spearman >= -1) & (image.spearman <= 1)).all())
    assert not torch.equal(image.attributions["exact"], image.attributions["drop"])
    assert "rise, exact vs drop on 2 examples" in str(image)
    # a callable explainer gets the MaskedForward of each mode
    seen = []
    agreement(vit, x, explainer=lambda forward, target: seen.append(forward.mode) or forward.presence, samples=1)
    assert seen == ["exact", "drop"]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"explainer": "gradcam"}, ValueError, "explainer must be one of"),
        ({"modes": ("exact",)}, ValueError, "modes must be a pair"),
        ({"modes": ("exact", "fast")}, ValueError, "mode must be one of"),
        ({"samples": 0}, ValueError, "samples"),
        ({"top": 0.0}, ValueError, "top"),
    ],
)
def test_agreement_argument_errors(vit, x, kwargs, error, match):
    with pytest.raises(error, match=match):
        agreement(vit, x, **kwargs)


def test_spearman_and_top_overlap_against_their_definitions():
    scipy_stats = pytest.importorskip("scipy.stats")
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(30, generator=gen), torch.randn(30, generator=gen)
    b[:5] = b[5]  # ties get their mean rank, as scipy's
    assert float(spearman(a, b)) == pytest.approx(scipy_stats.spearmanr(a.numpy(), b.numpy()).statistic, abs=1e-6)
    assert float(spearman(a, a * 3 + 1)) == pytest.approx(1.0)
    assert float(spearman(torch.ones(4), torch.ones(4))) == 1.0 and float(spearman(torch.ones(4), a[:4])) == 0.0
    assert float(top_overlap(torch.tensor([4.0, 3, 2, 1]), torch.tensor([4.0, 1, 2, 3]), 0.5)) == pytest.approx(1 / 3)
