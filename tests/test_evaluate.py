"""sopfast.evaluate: the batched runner equals the model's own outputs and the per-example loop."""

from __future__ import annotations

import json

import pytest
import torch

import sopfast
from sopfast.evaluation import metrics as M
from sopfast.evaluation.evaluate import (
    SOPMethod,
    evaluate,
    feature_ground_truth,
    format_table,
)
from sopfast.testing import make_bert, make_cnn, make_hf_vit, text_batch

LABELS = torch.tensor([0, 1, 2, 0, 1, 2])


@pytest.fixture(scope="module")
def vit_model():
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25, blur_kernel_size=3).eval()


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(3)
    return torch.randn(6, 3, 32, 32, generator=g), torch.rand(6, 16, generator=g) > 0.5


def _loader(images, with_gt: bool = True):
    x, gt = images
    return [(x[i : i + 3], LABELS[i : i + 3], *([gt[i : i + 3]] if with_gt else [])) for i in (0, 3)]


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_accuracy_and_fidelity_match_the_model(vit_model, images, mode):
    res = evaluate(vit_model, _loader(images), metrics=["accuracy", "error", "fidelity"], mode=mode, progress=False)
    with torch.no_grad():
        out = vit_model(images[0], mode=mode)
    sop = res["SOP"]
    assert sop["examples"] == 6
    assert sop["accuracy"] == pytest.approx(float(M.accuracy(out.logits, LABELS)))
    assert sop["error"] == pytest.approx(1 - sop["accuracy"])
    assert sop["fidelity"] < 1e-6


def test_full_input_step_equals_the_backbone(vit_model, images):
    """At τ = 1 every group is the whole input, λ = 1 and Σ c = 1, so SOP's output is the backbone's."""
    res = evaluate(vit_model, _loader(images), metrics=["insertion", "sparsity"], progress=False)["SOP"]
    with torch.no_grad():
        full = vit_model.backbone(pixel_values=images[0]).logits
    assert res["insertion_curve"][1.0] == pytest.approx(float(full.softmax(-1).max(-1).values.mean()), abs=1e-5)
    assert res["sparsity"][1.0] == pytest.approx(float(M.accuracy(full, LABELS)))
    assert list(res["sparsity"]) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def _loop_curves(model, x, deletion: bool) -> torch.Tensor:
    """The authors' way: one example, one step at a time, the whole model re-run with model.deletion."""
    rows = []
    model.deletion = deletion
    try:
        with torch.no_grad():
            for i in range(x.shape[0]):
                rows.append(torch.stack([model(x[i : i + 1], tau=t).logits[0] for t in [s / 10 for s in range(1, 11)]]))
    finally:
        model.deletion = False
    return torch.stack(rows)


def test_insertion_deletion_equal_the_per_example_loop(vit_model, images):
    res = evaluate(vit_model, _loader(images), metrics=["insertion", "deletion"], progress=False)["SOP"]
    assert res["insertion"] == pytest.approx(float(M.insertion(_loop_curves(vit_model, images[0], False))), abs=1e-5)
    assert res["deletion"] == pytest.approx(float(M.deletion(_loop_curves(vit_model, images[0], True))), abs=1e-5)


def test_sop_method_groups_equal_make_groups(vit_model, images):
    inputs = vit_model.prepare(images[0])
    method = SOPMethod()
    state = method.prepare(vit_model, inputs, "exact")
    with torch.no_grad():
        ours = method.groups(vit_model, state, 0.5, True, num_groups=2)
        theirs = vit_model.make_groups(inputs, tau=0.5, num_groups=2)
    assert torch.equal(ours.mask, theirs.mask) and torch.equal(ours.indices, theirs.indices)
    torch.testing.assert_close(ours.lam, theirs.lam)


def test_iou_coverage_object_ratio_use_the_groups_of_the_predicted_class(vit_model, images):
    res = evaluate(vit_model, _loader(images), metrics=["iou", "coverage", "object_ratio"], progress=False)["SOP"]
    with torch.no_grad():
        out = vit_model(images[0])
    pred = out.logits.argmax(-1)
    used = out.group_scores[torch.arange(6), pred] > 0
    assert res["iou"] == pytest.approx(float(M.group_iou(out.group_masks, images[1], used)), abs=1e-6)
    assert res["coverage"] == pytest.approx(float(M.group_coverage(out.group_masks, images[1], used)), abs=1e-6)
    ratios = M.object_ratio(out.group_masks, images[1], used, reduction="none")
    assert res["object_ratio"] == M.object_ratio_by_correctness(ratios, pred == LABELS)


def test_diversity_describes_the_models_groups(vit_model, images):
    res = evaluate(vit_model, _loader(images), metrics=["diversity"], baselines=["gxi-f"], progress=False)
    with torch.no_grad():
        out = vit_model(images[0])
    used = out.group_scores[torch.arange(6), out.logits.argmax(-1)] > 0
    expected = {k: float(v.nanmean()) for k, v in M.group_diversity(out.group_masks, used=used).items()}
    assert {k: res["SOP"][k] for k in M.DIVERSITY} == pytest.approx(expected, abs=1e-6)
    one_group = res["GxI-F"]
    assert one_group["distinct_groups"] == 1.0 and one_group["groups_used"] == 1.0
    assert one_group["union_coverage"] == pytest.approx(0.25)
    assert "pairwise_iou" in format_table(res)


def test_num_groups_ablation_reruns_with_fewer_groups(vit_model, images):
    res = evaluate(vit_model, _loader(images), metrics=["accuracy", "num_groups"], group_counts=[1, 4], progress=False)[
        "SOP"
    ]
    inputs = vit_model.prepare(images[0])
    with torch.no_grad():
        one = vit_model.predict_groups(inputs, vit_model.make_groups(inputs, num_groups=1)).logits
    assert res["num_groups"] == {1: pytest.approx(float(M.accuracy(one, LABELS))), 4: res["accuracy"]}


def test_leakage_reports_probe_and_chance(vit_model, images):
    loader = _loader(images) * 3
    res = evaluate(vit_model, loader, metrics=["leakage"], progress=False)["SOP"]["leakage"]
    assert res["num_train"] + res["num_test"] == 18
    assert 0.0 <= res["accuracy"] <= 1.0 and 0.0 <= res["chance"] <= 1.0


def test_text_dict_batches_with_evidence_masks():
    torch.manual_seed(0)
    model = sopfast.SOP(make_bert(), num_groups=3, tau=0.3).eval()
    ids, mask, types = text_batch()
    evidence = torch.zeros_like(mask, dtype=torch.bool)
    evidence[:, 1:5] = True
    labels = torch.tensor([0, 1, 1])
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "labels": labels,
        "evidence_mask": evidence,
    }
    res = evaluate(model, [batch], metrics=["accuracy", "fidelity", "iou"], mode="drop", progress=False)["SOP"]
    with torch.no_grad():
        out = model(ids, mask, types, mode="drop")
    used = out.group_scores[torch.arange(3), out.logits.argmax(-1)] > 0
    assert res["accuracy"] == pytest.approx(float(M.accuracy(out.logits, labels)))
    assert res["iou"] == pytest.approx(float(M.group_iou(out.group_masks, evidence, used)), abs=1e-6)
    assert res["fidelity"] < 1e-6


def test_regression_cnn_purity_and_mse():
    torch.manual_seed(0)
    model = sopfast.SOP(
        make_cnn(num_classes=2), num_groups=4, tau=0.25, task="regression", feature_layer="features"
    ).eval()
    x, y = torch.randn(4, 3, 16, 16), torch.randn(4, 2)
    res = evaluate(model, [(x, y)], metrics=["mse", "purity", "insertion"], progress=False)["SOP"]
    with torch.no_grad():
        out = model(x)
    pixel_masks = out.group_masks.view(4 * 4, 8, 8).repeat_interleave(2, 1).repeat_interleave(2, 2).view(4, 4, -1)
    purity = M.cosmogrid_purity(pixel_masks, x.mean(1).flatten(1), out.group_scores > 0)
    assert res["mse"] == pytest.approx(float(M.mse(out.logits, y)), abs=1e-6)
    assert res["purity"] == pytest.approx(float(purity), abs=1e-6)
    assert res["insertion"] == pytest.approx(res["insertion_auc"])


def test_pixel_ground_truth_is_pooled_to_patches(vit_model):
    inputs = vit_model.prepare(torch.zeros(1, 3, 32, 32))
    gt = torch.zeros(1, 32, 32, dtype=torch.bool)
    gt[0, :8, :8] = True
    gt[0, 8:11, 8:16] = True
    expected = torch.zeros(1, 16, dtype=torch.bool)
    expected[0, 0] = True
    assert torch.equal(feature_ground_truth(vit_model, inputs, gt), expected)
    assert torch.equal(feature_ground_truth(vit_model, inputs, expected.view(1, 4, 4)), expected)


def test_baselines_get_the_same_metrics_and_the_table_lists_them(vit_model, images):
    res = evaluate(
        vit_model,
        _loader(images),
        metrics=["accuracy", "fidelity", "sparsity"],
        baselines=["gxi-f", "patches"],
        taus=[0.5, 1.0],
        progress=False,
    )
    assert list(res) == ["SOP", "GxI-F", "PatchGrid", "Backbone"]
    assert all(r["fidelity"] < 1e-6 for n, r in res.items() if n != "Backbone")
    table = format_table(res)
    assert "GxI-F" in table and "PatchGrid" in table and "τ=0.5" in table


def test_training_state_is_restored(vit_model, images):
    vit_model.train()
    evaluate(vit_model, _loader(images), metrics=["accuracy"], progress=False)
    assert vit_model.training and vit_model.projection.training
    vit_model.eval()


def test_cli_runs_and_writes_json(tmp_path):
    """``sopfast evaluate``: its flags are sopfast.evaluate's keywords; the JSON holds the results."""
    import user_data as U
    from sopfast.cli import main

    backbone = U.vit_dir(tmp_path)
    model = sopfast.SOP(sopfast.adapters.load_backbone(str(backbone)).model, num_groups=3, tau=0.25)
    model.save_pretrained(str(tmp_path / "ckpt"))
    out = tmp_path / "res.json"
    source = ["--backbone", str(backbone), "--checkpoint", str(tmp_path / "ckpt")]
    data = ["--data", str(U.image_folder(tmp_path, per_class=2)), "--holdout", "0.5"]
    flags = ["--metrics", "accuracy", "sparsity", "--taus", "0.5", "1.0", "--no-progress", "--output", str(out)]
    assert main(["evaluate", *source, *data, *flags]) == 0
    results = json.loads(out.read_text())["SOP"]
    assert 0.0 <= results["accuracy"] <= 1.0 and list(results["sparsity"]) == ["0.5", "1.0"]


@pytest.mark.parametrize(
    "kwargs, loader, match",
    [
        ({"metrics": ["accuracy"]}, [], "no batches"),
        ({"metrics": ["acuracy"]}, None, "unknown metric 'acuracy'"),
        ({"metrics": []}, None, "at least one metric"),
        ({"metrics": ["mse"]}, None, "needs a regression model"),
        ({"metrics": ["sparsity"], "taus": [0.0, 0.5]}, None, r"taus must hold values in \(0, 1\]"),
        ({"metrics": ["sparsity"], "taus": [1.5]}, None, r"taus must hold values in \(0, 1\]"),
        ({"metrics": ["insertion"], "step": 0.3}, None, "step must divide 1"),
        ({"metrics": ["num_groups"], "group_counts": [0]}, None, "group_counts must be positive"),
        ({"metrics": ["iou"]}, "no_gt", "need ground-truth masks"),
        ({"metrics": ["iou"]}, "bad_gt", r"ground-truth mask must have shape \[B, d\] = \[3, 16\]"),
        ({"metrics": ["accuracy"]}, "no_labels", "need labels"),
        ({"metrics": ["accuracy"], "mode": "fast"}, None, "mode must be one of"),
        ({"metrics": ["accuracy"], "baselines": ["lime-x"]}, None, "unknown baseline 'lime-x'"),
        ({"metrics": ["accuracy"], "ground_truth_key": "mask"}, None, "names a dict key but the batch is a tuple"),
        ({"metrics": ["accuracy"]}, "dict_no_input", "got a dict with keys"),
    ],
)
def test_bad_arguments_raise_clear_errors(vit_model, images, kwargs, loader, match):
    x = images[0][:3]
    loaders = {
        None: _loader(images),
        "no_gt": _loader(images, with_gt=False),
        "bad_gt": [(x, LABELS[:3], torch.ones(3, 15, dtype=torch.bool))],
        "no_labels": [(x,)],
        "dict_no_input": [{"pixels": x}],
    }
    with pytest.raises(ValueError, match=match):
        evaluate(
            vit_model,
            loaders[loader] if loader is None or isinstance(loader, str) else loader,
            progress=False,
            **kwargs,
        )


def test_unsupported_batch_type_raises_type_error(vit_model):
    with pytest.raises(TypeError, match="a batch must be a tensor x, a tuple/list"):
        evaluate(vit_model, [42], metrics=["accuracy"], progress=False)


@pytest.mark.parametrize(
    "form",
    [
        lambda x, y: (x, y),
        lambda x, y: [x, y],
        lambda x, y: {"pixel_values": x, "labels": y},
        lambda x, y: {"x": x, "label": y},
        lambda x, y: {"images": x, "y": y},
    ],
    ids=["tuple", "list", "pixel_values-labels", "x-label", "images-y"],
)
def test_every_batch_form_of_sopfast_batches_gives_the_same_results(vit_model, images, form):
    """evaluate parses loader items with sopfast.data.batches.parse_batch, so every form it accepts works."""
    x = images[0]
    expected = evaluate(vit_model, [(x, LABELS)], metrics=["accuracy", "fidelity"], progress=False)["SOP"]
    assert evaluate(vit_model, [form(x, LABELS)], metrics=["accuracy", "fidelity"], progress=False)["SOP"] == expected
    bare = evaluate(vit_model, [x], metrics=["fidelity"], progress=False)["SOP"]
    assert bare["fidelity"] == expected["fidelity"] and bare["examples"] == 6
