"""Issue #34's pieces of the text study: parts of a test set combined, the targets table, the text page."""

import math

import pytest
import torch

import sopfast
from sopfast.demo.report import text_targets
from sopfast.evaluation.parts import combine_parts
from sopfast.testing import make_bert, text_batch


def test_combine_parts_weights_each_part_by_its_examples():
    short = {"SOP": {"accuracy": 1.0, "examples": 1, "curves": {"0.2/8": 0.5}, "insertion": math.nan, "note": "a"}}
    long = {
        "SOP": {"accuracy": 0.5, "examples": 3, "curves": {"0.2/8": 0.9}, "insertion": 0.7, "note": "b"},
        "IG-F": {"accuracy": 0.1, "examples": 3},
    }
    out = combine_parts([short, long])
    assert set(out) == {"SOP"}, "a method missing from a part is left out"
    sop = out["SOP"]
    assert sop["accuracy"] == pytest.approx((1.0 + 3 * 0.5) / 4)
    assert sop["curves"]["0.2/8"] == pytest.approx((0.5 + 3 * 0.9) / 4)
    assert sop["insertion"] == pytest.approx(0.7), "NaN parts are left out"
    assert sop["examples"] == 4 and sop["note"] == "a"
    with pytest.raises(ValueError, match="at least one part"):
        combine_parts([])


def test_text_targets_hold_sop_against_the_best_rival_and_random_groups():
    comparison = {
        "SOP": {"accuracy": 0.85, "curves": {"0.05/8": 0.80, "0.1/8": 0.80, "0.2/8": 0.85}, "distinct_groups": 5.0},
        "IG-F": {"accuracy": 0.84, "insertion": 1.1},
        "LIME-F": {"accuracy": 0.90},
        "FRESH": {"accuracy": 0.70},
        "Random": {"curves": {"0.05/8": 0.76, "0.1/8": 0.78, "0.2/8": 0.80}},
    }
    comparison["SOP"]["insertion"] = 1.0
    rows = {name: (sop, other, met) for name, sop, other, met in text_targets(comparison)}
    assert rows["accuracy ≥ the best -F / FRESH (LIME-F)"] == (0.85, 0.90, False)
    assert rows["τ = 0.05: ≥ random groups + 0.03"][2] is True
    assert rows["τ = 0.1: ≥ random groups + 0.03"][2] is False
    assert rows["τ = 0.2: ≥ random groups + 0.03"][1] == pytest.approx(0.83)
    assert rows["distinct groups ≥ 6 of 8"] == (5.0, 6.0, False)
    assert rows["insertion ≥ IG-F's"] == (1.0, 1.1, False)


def test_text_page_shows_each_groups_words_the_truth_and_the_unused_groups(tmp_path):
    from sopfast.model.pictures import explain_text

    torch.manual_seed(0)
    model = sopfast.SOP(make_bert(), num_groups=3, tau=0.3).eval()
    ids, mask, types = text_batch(pairs=False)
    with torch.no_grad():
        out = model(ids[:1], mask[:1], types[:1])
    tokens = ["good" if t % 2 == 0 else "##ish" for t in range(ids.shape[1])]
    out.group_masks[0] = False
    out.group_masks[0, :, 0] = True
    out.group_masks[0, :, 1] = True  # every group: "good" + "##ish", one word "goodish"
    explain_text(tokens, out, 0, str(tmp_path / "t.html"), ("neg", "pos"), mask[0], label=1)
    page = (tmp_path / "t.html").read_text()
    assert "<b>goodish</b>" in page and "true class: pos" in page and "alone: " in page
    assert "selector weight c = " in page
