"""The paper's accuracy curves (τ × group count), grounding against object masks (RQ5), the curves
picture, object masks from images, and pictures of explanations from Python."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import sopfast
import user_data as U
from sopfast.cli.app import main
from sopfast.data.object_masks import ObjectMasks
from sopfast.evaluation.plots import plot_curves
from sopfast.testing import make_bert, make_hf_vit, text_batch

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25).eval()


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 32, 32, generator=g)
    x[:, :, :, 16:] = -1.0  # the right half is black: the "object" is the left half
    x[:, :, :, :16] = x[:, :, :, :16].abs() + 0.5
    return x, torch.tensor([0, 1, 2, 0, 1, 2])


def test_curves_are_accuracy_at_each_sparsity_and_group_count(model, images):
    x, y = images
    loader = DataLoader(TensorDataset(x, y), batch_size=3)
    res = sopfast.evaluate(
        model,
        loader,
        metrics=["curves"],
        baselines=["gxi-f"],
        curve_taus=(0.25, 0.5),
        curve_counts=(1, 4),
        progress=False,
    )
    assert set(res["SOP"]["curves"]) == {"0.25/1", "0.25/4", "0.5/1", "0.5/4"}
    assert set(res["GxI-F"]["curves"]) == {"0.25", "0.5"}  # one group: τ only
    for key, value in res["SOP"]["curves"].items():
        tau, m = key.split("/")
        model.tau, model.num_groups = float(tau), int(m)
        try:
            with torch.no_grad():
                expected = float((model(x).logits.argmax(-1) == y).float().mean())
        finally:
            model.tau, model.num_groups = 0.25, 4
        assert value == pytest.approx(expected)


def test_curves_picture(model, images, tmp_path):
    x, y = images
    res = sopfast.evaluate(model, [(x, y)], metrics=["curves"], baselines=["random", "gxi-f"], progress=False)
    path = plot_curves(res, str(tmp_path / "curves.png"))
    assert open(path, "rb").read(8) == PNG
    with pytest.raises(ValueError, match="no curves"):
        plot_curves({"SOP": {"accuracy": 1.0}}, str(tmp_path / "none.png"))


def test_object_masks_from_intensity_and_their_spec():
    assert ObjectMasks.parse("intensity") == ObjectMasks(None, 0.1)
    assert ObjectMasks.parse("intensity:0.3") == ObjectMasks(None, 0.3)
    assert ObjectMasks.parse("mask") == ObjectMasks("mask")
    with pytest.raises(ValueError, match=r"threshold must lie in \(0, 1\)"):
        ObjectMasks.parse("intensity:2")
    with pytest.raises(ValueError, match="must be a number"):
        ObjectMasks.parse("intensity:high")
    images = torch.full((1, 3, 2, 2), -1.0)
    images[0, :, 0, 1] = 1.0
    assert ObjectMasks().from_pixels(images).tolist() == [[[False, True], [False, False]]]


def test_grounding_is_the_share_of_each_group_on_the_object(model, images):
    x, y = images
    masks = ObjectMasks(threshold=0.5).from_pixels(x, low=-1.0, high=3.0)  # the bright left half
    res = sopfast.evaluate(
        model, [(x, y, masks)], metrics=["grounding"], ground_truth_key=2, backbone_row=False, progress=False
    )
    with torch.no_grad():
        groups = model(x).group_masks  # [B, m, 16] on the 4×4 patch grid
    on_object = torch.zeros(4, 4, dtype=torch.bool)
    on_object[:, :2] = True  # patches of the left half
    share = (groups & on_object.flatten()).sum(-1).float() / groups.sum(-1).clamp_min(1)
    assert res["SOP"]["on_object"] == pytest.approx(float(share.mean()), abs=1e-6)
    iou = (groups & on_object.flatten()).sum(-1).float() / (groups | on_object.flatten()).sum(-1)
    assert res["SOP"]["object_iou"] == pytest.approx(float(iou.mean()), abs=1e-6)
    assert 0.0 <= res["SOP"]["on_object_used"] <= 1.0


def test_cli_evaluate_with_intensity_object_masks(tmp_path, capsys):
    vit, images = U.vit_dir(tmp_path), U.image_folder(tmp_path, per_class=4)
    run = tmp_path / "run"
    fast = ["--batch-size", "4", "--num-groups", "4", "--no-progress", "--epochs", "1"]
    assert main(["train", "--backbone", str(vit), "--data", str(images), "--output-dir", str(run), *fast]) == 0
    out = tmp_path / "res.json"
    argv = ["evaluate", "--checkpoint", str(run), "--data", str(images), "--object-masks", "intensity:0.5"]
    assert main([*argv, "--output", str(out), "--no-progress", "--holdout", "0.5"]) == 0, capsys.readouterr().err
    results = json.loads(out.read_text())["SOP"]
    assert {"on_object", "object_iou", "iou", "coverage"} <= set(results)
    assert (tmp_path / "res_curves.png").read_bytes()[:8] == PNG  # the curves picture beside the results
    chosen = tmp_path / "chosen.json"
    flags = ["--metrics", "accuracy", "diversity", "--baselines", "random", "--output", str(chosen)]
    assert main([*argv, *flags, "--no-progress", "--holdout", "0.5"]) == 0, capsys.readouterr().err
    results = json.loads(chosen.read_text())
    assert set(results) == {"SOP", "Random", "Backbone"}
    assert "distinct_groups" in results["SOP"] and "insertion" not in results["SOP"]  # only what was asked


def test_explain_from_python_writes_pictures(model, images, tmp_path):
    x, y = images
    paths = model.explain(x[:2], tmp_path / "pictures", class_names=["a", "b", "c"], labels=y[:2])
    assert len(paths) == 2 and all(open(p, "rb").read(8) == PNG for p in paths)
    bert = sopfast.SOP(make_bert(), num_groups=3).eval()
    ids, attention, types = text_batch()
    pages = bert.explain(ids, tmp_path / "texts", attention, types)
    assert len(pages) == 3 and all(p.endswith(".html") for p in pages)
    assert "<html" in open(pages[0], encoding="utf-8").read().lower()
