"""Attributions shaped like the input: per-feature sums, maps in input space, the Captum-style
wrapper, and Quantus metrics run (with the real Quantus and Captum) on SOP and on a Captum baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sopfast
from sopfast.explain import SOPAttribution, SOPClassifier, attribute, quantus_explain_func, to_input_space
from sopfast.testing import make_bert, make_cnn, make_hf_vit, text_batch


@pytest.fixture
def vit_sop():
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=5, tau=0.25).eval()


def test_feature_attributions_sum_each_feature_over_its_groups(vit_sop):
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        out = vit_sop(x)
    target = torch.tensor([0, 2, 1])
    got = out.feature_attributions(target)
    assert got.shape == (3, 16)
    for b in range(3):
        alpha = out.attributions[b, target[b]]
        want = sum(alpha[i] * out.group_masks[b, i].float() for i in range(out.group_masks.shape[1]))
        torch.testing.assert_close(got[b], want)
    predicted = out.logits.argmax(-1)
    torch.testing.assert_close(out.feature_attributions(), out.feature_attributions(predicted))
    torch.testing.assert_close(out.feature_attributions(1), out.feature_attributions(torch.ones(3, dtype=torch.long)))


@pytest.mark.parametrize("target", [3, -1, [0, 1], 0.5])
def test_feature_attributions_reject_bad_targets(vit_sop, target):
    with torch.no_grad():
        out = vit_sop(torch.randn(3, 3, 32, 32))
    with pytest.raises(ValueError, match="target must"):
        out.feature_attributions(target)


def test_to_input_space_gives_each_pixel_its_patch_value(vit_sop):
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feature = vit_sop(x).feature_attributions(0)
    pixels = to_input_space(vit_sop, feature, x)
    assert pixels.shape == x.shape
    patches = pixels[:, 0].reshape(2, 4, 8, 4, 8)
    torch.testing.assert_close(patches[:, :, 3, :, 5], feature.reshape(2, 4, 4))
    assert torch.equal(pixels[:, 0], pixels[:, 2])
    torch.testing.assert_close(pixels[:, 0].sum((1, 2)), feature.sum(1) * 64)
    with pytest.raises(ValueError, match=r"must be \[B, d\]"):
        to_input_space(vit_sop, feature[:, :5], x)


def test_to_input_space_for_cnn_cells_and_text_tokens():
    cnn = sopfast.SOP(make_cnn(), num_groups=4, feature_layer="features").eval()
    x = torch.randn(2, 3, 16, 16)
    assert attribute(cnn, x, target=[0, 2]).shape == (2, 3, 16, 16)
    bert = sopfast.SOP(make_bert(), num_groups=3, tau=0.3).eval()
    ids, mask, types = text_batch()
    tokens = attribute(bert, ids, 1, mask, types)
    assert tokens.shape == ids.shape
    assert torch.all(tokens[mask == 0] == 0)


def test_captum_style_wrapper_matches_the_output_and_keeps_tuples(vit_sop):
    x = torch.randn(2, 3, 32, 32)
    explainer = SOPAttribution(vit_sop)
    assert explainer.forward_func is vit_sop and not explainer.has_convergence_delta()
    single = explainer.attribute(x, target=1)
    (as_tuple,) = explainer.attribute((x,), target=1)
    with torch.no_grad():
        expected = to_input_space(vit_sop, vit_sop(x).feature_attributions(1), x)
    torch.testing.assert_close(single, expected)
    torch.testing.assert_close(as_tuple, expected)
    bert = sopfast.SOP(make_bert(), num_groups=3).eval()
    ids, mask, types = text_batch()
    assert SOPAttribution(bert).attribute(ids, target=0, additional_forward_args=(mask, types)).shape == ids.shape


def test_captum_visualiser_draws_the_sop_map(vit_sop):
    import matplotlib

    matplotlib.use("Agg")
    from captum.attr import visualization

    x = torch.randn(1, 3, 32, 32)
    attr = SOPAttribution(vit_sop).attribute(x, target=0)
    fig, _ = visualization.visualize_image_attr(
        attr[0].permute(1, 2, 0).numpy(),
        x[0].permute(1, 2, 0).numpy(),
        method="heat_map",
        sign="all",
        use_pyplot=False,
    )
    assert fig is not None


def _captum_saliency(model, inputs, targets, **kwargs) -> np.ndarray:
    """A Captum baseline as a Quantus ``explain_func``: gradient saliency of the same model."""
    from captum.attr import Saliency

    x = torch.as_tensor(inputs, dtype=torch.float32).requires_grad_(True)
    return Saliency(model).attribute(x, target=torch.as_tensor(targets).long()).detach().numpy()


def test_quantus_faithfulness_and_region_perturbation_on_sop_and_a_captum_baseline(vit_sop):
    import quantus

    torch.manual_seed(1)
    model = SOPClassifier(vit_sop).eval()
    x = torch.randn(4, 3, 32, 32).numpy()
    with torch.no_grad():
        y = model(torch.from_numpy(x)).argmax(-1).numpy()
    a = quantus_explain_func(model, x, y)
    assert a.shape == x.shape and np.abs(a).sum() > 0
    scores = {}
    for name, explain_func in (("sop", quantus_explain_func), ("captum_saliency", _captum_saliency)):
        faithfulness = quantus.FaithfulnessCorrelation(
            nr_runs=5, subset_size=64, perturb_baseline="black", disable_warnings=True, display_progressbar=False
        )
        region = quantus.RegionPerturbation(
            patch_size=8,
            regions_evaluation=4,
            perturb_baseline="uniform",
            disable_warnings=True,
            display_progressbar=False,
        )
        kwargs = {
            "model": model,
            "x_batch": x,
            "y_batch": y,
            "a_batch": None,
            "explain_func": explain_func,
            "device": "cpu",
        }
        scores[name] = (np.asarray(faithfulness(**kwargs), dtype=float), region(**kwargs))
    for corr, curves in scores.values():
        assert corr.size >= 1 and np.all(np.isfinite(corr)) and np.all(np.abs(corr) <= 1 + 1e-6)
        assert len(curves) == 4 and all(np.isfinite(np.asarray(c, dtype=float)).all() for c in curves)
