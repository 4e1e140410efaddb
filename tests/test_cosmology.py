"""The cosmology path (issue #44): purity on maps with known voids and clusters, the RQ7 weights, the
regression diagnostic, saliency and adaptation, and a folder of ``.npy`` maps with a CSV of targets
through ``sopfast train`` / ``evaluate`` / ``predict`` (and ``--data weak-lensing``)."""

from __future__ import annotations

import csv

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import sopfast
from sopfast.cli.app import main
from sopfast.data.labels import DataError
from sopfast.data.maps import load_maps
from sopfast.data.weak_lensing import Simulator
from sopfast.demo.lensing_cnn import FEATURE_LAYER, LensingCNN
from sopfast.evaluation import metrics as M
from sopfast.evaluation.evaluate import evaluate
from sopfast.evaluation.methods import Method, Prediction
from sopfast.evaluation.registry import PURITY_THRESHOLDS
from sopfast.masking.diagnose import diagnose
from sopfast.masking.regression_diagnosis import RegressionDiagnosis
from sopfast.model.losses import feature_saliency

FAST = ["--epochs", "1", "--batch-size", "4", "--num-groups", "3", "--no-progress", "--quiet"]


def _cnn(seed: int = 0) -> LensingCNN:
    torch.manual_seed(seed)
    return LensingCNN(width=4).eval()


def _sop(seed: int = 0, **options) -> sopfast.SOP:
    torch.manual_seed(seed)
    return sopfast.SOP(_cnn(seed), num_groups=3, tau=0.2, task="regression", feature_layer=FEATURE_LAYER, **options)


# -- purity on maps whose voids and clusters are known ---------------------------------------------
def _known_map() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A 66×66 map on the 11×11 patch grid: a void (the top-left 3×3 patches, κ = −1), one cluster pixel
    (in patch (8, 8), κ = 40), the rest +0.1; groups of 4 patches: all void, holding the cluster, neither."""
    x = torch.full((1, 1, 66, 66), 0.1)
    x[..., :18, :18] = -1.0
    x[..., 50, 50] = 40.0
    grid = torch.zeros(3, 11, 11, dtype=torch.bool)
    grid[0, :2, :2] = True  # inside the void
    grid[1, 8, 8] = grid[1, 8, 9] = grid[1, 9, 8] = grid[1, 9, 9] = True  # the cluster pixel in (8, 8)
    grid[2, 5:7, 0:2] = True  # plain
    return x, {"void": grid[0], "cluster": grid[1], "neither": grid[2]}


class _Fixed(Method):
    """The given groups; output ``c`` uses the groups named in ``uses[c]``."""

    def __init__(self, name: str, groups: list[torch.Tensor], uses: list[list[int]]):
        self.name, self.groups, self.uses = name, groups, uses

    def predict(self, model, inputs, state, tau, largest, mode, num_groups=None) -> Prediction:
        masks = torch.stack([g.flatten() for g in self.groups]).unsqueeze(0)
        used = torch.zeros(1, 2, len(self.groups), dtype=torch.bool)
        for c, groups in enumerate(self.uses):
            used[0, c, groups] = True
        logits = torch.zeros(1, 2)
        return Prediction(logits, torch.zeros(1, 2, len(self.groups)), masks, used)


def test_purity_finds_the_known_void_and_cluster():
    x, groups = _known_map()
    void, cluster = groups["void"], groups["cluster"]
    methods = [
        _Fixed("voids", [void, void], [[0], [1]]),
        _Fixed("clusters", [cluster, cluster], [[0], [1]]),
        _Fixed("mixed", [void, groups["neither"]], [[0, 1], [0]]),
    ]
    results = evaluate(_sop(), [(x, torch.zeros(1, 2))], metrics=["purity"], baselines=methods, progress=False)
    # a void group scores (1 + 0) / 2, the cluster group (0 + 1) / 2 (1 of 144 pixels > 3σ: above 1.5 %? no)
    assert results["voids"]["purity"] == pytest.approx(0.5)
    pixels = 144  # 4 patches of 6×6
    assert 1 / pixels < 0.015 and results["clusters"]["purity"] == pytest.approx(0.0)
    assert results["clusters"]["purity_thresholds"]["0.6/0.005"] == pytest.approx(0.5)  # τ_c 0.005 < 1/144
    # output 0 uses the void and the plain group (0.5, 0), output 1 the void (0.5): (0.25 + 0.5) / 2
    assert results["mixed"]["purity"] == pytest.approx(0.375)
    assert set(results["voids"]["purity_thresholds"]) == {f"{v:g}/{c:g}" for v, c in PURITY_THRESHOLDS}
    assert results["voids"]["purity_thresholds"]["0.8/0.015"] == pytest.approx(0.5)  # all its pixels are < 0


def test_structure_weights_merge_identical_groups_and_keep_the_kinds():
    masks = torch.tensor([[[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1]]], dtype=torch.bool)
    scores = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.0, 0.8]]])
    merged = M.merged_group_weights(masks, scores)
    assert torch.allclose(merged, torch.tensor([[[1.0, 0.0, 0.0], [0.2, 0.0, 0.8]]]))
    void, cluster = torch.tensor([[0.9, 0.9, 0.1]]), torch.tensor([[0.0, 0.0, 0.2]])
    weights = M.structure_weights(void, cluster, merged)
    assert [w.tolist() for w in weights["void"]] == [[1.0], [pytest.approx(0.2)]]
    assert [w.tolist() for w in weights["cluster"]] == [[], [pytest.approx(0.8)]]


# -- the regression diagnostic, saliency and adaptation -----------------------------------------------
@pytest.fixture(scope="module")
def maps():
    return Simulator().simulate(16, seed=5)


def test_regression_diagnostic_measures_mse(maps):
    model = _sop()
    report = diagnose(model, maps.dataset(), examples=16, progress=False)
    assert isinstance(report, RegressionDiagnosis) and report.examples == 16
    assert report.mean_mse == pytest.approx(float((maps.targets - maps.targets.mean(0)).pow(2).mean()), rel=1e-5)
    with torch.no_grad():
        full = model.backbone(maps.x)
    assert report.full_mse == pytest.approx(float((full - maps.targets).pow(2).mean()), rel=1e-5)
    assert set(report.random_groups) == {"exact"} and report.verdict
    assert "MSE against targets" in str(report) and report.to_dict()["retained"]["exact"] >= 0.0


def test_regression_saliency_is_the_gradient_towards_the_full_prediction(maps):
    model = _sop()
    inputs = model.prepare(maps.x[:3])
    saliency = feature_saliency(model, inputs, 0.4)
    z = torch.full((3, 121), 0.4, requires_grad=True)
    with torch.no_grad():
        full = model.backbone(maps.x[:3])
    out = model.adapter.soft_forward(inputs, z)
    (grad,) = torch.autograd.grad(-0.5 * (out - full).pow(2).sum(), z)
    assert torch.allclose(saliency, grad, atol=1e-6)


def test_adapting_a_regressor_fits_the_targets_and_the_original(maps, tmp_path):
    result = sopfast.adapt_backbone(
        _cnn(),
        maps.dataset(),
        steps=3,
        batch_size=8,
        task="regression",
        feature_layer=FEATURE_LAYER,
        progress=False,
        output_dir=tmp_path / "adapted",
    )
    assert isinstance(result.before, RegressionDiagnosis) and isinstance(result.after, RegressionDiagnosis)
    assert result.provenance["settings"]["task"] == "regression"
    assert "whole inputs (MSE)" in str(result) and (tmp_path / "adapted" / "backbone.pt").exists()
    with pytest.raises(ValueError, match="regression targets"):
        sopfast.adapt_backbone(
            _cnn(),
            [(maps.x[:4], torch.zeros(4))],
            steps=1,
            task="regression",
            feature_layer=FEATURE_LAYER,
            progress=False,
        )


# -- your own maps ---------------------------------------------------------------------------------
def _map_folder(root, n: int = 12, split: bool = False, extra: dict | None = None):
    maps = Simulator().simulate(n, seed=7)
    folder = root / "maps"
    folder.mkdir()
    with open(folder / "targets.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "Omega_m", "sigma_8", *(["split"] if split else [])])
        for i in range(n):
            np.save(folder / f"map_{i:03d}.npy", maps.x[i, 0].numpy())
            part = ["train"] * 8 + ["validation"] * 2 + ["test"] * 2
            writer.writerow([f"map_{i:03d}.npy", *maps.targets[i].tolist(), *([part[i]] if split else [])])
    return folder, maps


def test_a_map_folder_is_cut_in_disjoint_roles(tmp_path):
    folder, maps = _map_folder(tmp_path)
    parts = {role: load_maps(str(folder), role, 0.25) for role in ("train", "val", "test")}
    files = {role: set(d.sources) for role, (d, _) in parts.items()}
    assert sum(map(len, files.values())) == 12 and not (files["train"] & files["val"] | files["train"] & files["test"])
    x, y = parts["test"][0][0]
    index = int(parts["test"][0].sources[0][-7:-4])
    assert torch.equal(x, maps.x[index]) and torch.allclose(y, maps.targets[index])
    assert "targets Omega_m, sigma_8" in parts["train"][1]
    whole, _ = load_maps(str(folder), "train", None, limit=5, target_columns=["sigma_8"])
    assert len(whole) == 5 and whole[0][1].shape == (1,)


def test_a_split_column_assigns_the_rows(tmp_path):
    folder, _ = _map_folder(tmp_path, split=True)
    assert [len(load_maps(str(folder), role, 0.25)[0]) for role in ("train", "val", "test")] == [8, 2, 2]


@pytest.mark.parametrize(
    "edit, error",
    [
        (lambda f: (f / "targets.csv").write_text("name,a\nmap_000.npy,1\n"), "no 'file' column"),
        (lambda f: (f / "targets.csv").write_text("file,a\nmap_000.npy,x\nmap_001.npy,1\n"), "finite number"),
        (lambda f: (f / "targets.csv").write_text("file,a\nnone.npy,1\nmap_001.npy,2\n"), "do not exist"),
        (lambda f: (f / "other.csv").write_text("file\n"), "one CSV"),
        (lambda f: (f / "map_000.npy").write_bytes(b"junk"), "cannot be read"),
    ],
)
def test_map_folder_mistakes_name_the_problem(tmp_path, edit, error):
    folder, _ = _map_folder(tmp_path)
    edit(folder)
    with pytest.raises(DataError, match=error):
        dataset, _ = load_maps(str(folder), "train", None)
        dataset[0]


def test_train_evaluate_predict_on_a_map_folder(tmp_path, capsys):
    folder, maps = _map_folder(tmp_path)
    backbone = tmp_path / "cnn.pt"
    torch.save(_cnn(), backbone)
    run = tmp_path / "run"
    model_flags = ["--backbone", str(backbone), "--trust-pickle", "--task", "regression"]
    argv = ["train", *model_flags, "--feature-layer", FEATURE_LAYER, "--data", str(folder), "--holdout", "0.25"]
    assert main([*argv, "--output-dir", str(run), *FAST]) == 0, capsys.readouterr().err
    model = sopfast.SOP.from_pretrained(run / "last", backbone=_cnn())
    assert model.task == "regression"
    capsys.readouterr()
    loaded = ["--checkpoint", str(run / "last"), "--backbone", str(backbone), "--trust-pickle", "--no-progress"]
    assert main(["evaluate", *loaded, "--metrics", "mse", "purity"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "mse" in printed and "purity" in printed
    assert main(["diagnose", *loaded, "--examples", "4"]) == 0, capsys.readouterr().err
    assert "MSE against targets" in capsys.readouterr().out
    out = tmp_path / "predictions"
    assert main(["predict", *loaded, "--output-dir", str(out)]) == 0, capsys.readouterr().err
    rows = pq.read_table(out / "data").to_pydict()
    assert len(rows["id"]) == 12  # predict reads the whole folder
    assert all(len(label) == 2 for label in rows["label"]) and rows["source"][0].endswith(".npy")
    first = rows["source"].index(str(folder / "map_000.npy"))
    assert rows["label"][first] == pytest.approx(maps.targets[0].tolist())
    assert main([*argv, "--image-size", "32", *FAST]) == 2
    assert "does not apply" in capsys.readouterr().err


def test_diagnose_adapt_and_unlabelled_maps_from_the_command_line(tmp_path, capsys):
    folder, _ = _map_folder(tmp_path)
    backbone = tmp_path / "cnn.pt"
    torch.save(_cnn(), backbone)
    given = ["--backbone", str(backbone), "--trust-pickle", "--task", "regression", "--feature-layer", FEATURE_LAYER]
    given += ["--data", str(folder)]
    assert main(["diagnose", *given, "--examples", "4", "--no-progress"]) == 0, capsys.readouterr().err
    assert "MSE against targets" in capsys.readouterr().out
    adapted = tmp_path / "adapted"
    assert main(["adapt", *given, "--steps", "2", "--output-dir", str(adapted), "--no-progress"]) == 0
    assert "whole inputs (MSE)" in capsys.readouterr().err and (adapted / "backbone.pt").exists()
    (folder / "targets.csv").write_text("file\n" + "".join(f"map_{i:03d}.npy\n" for i in range(12)))
    assert main(["train", *given, "--output-dir", str(tmp_path / "run"), *FAST]) == 2
    assert "have no labels" in capsys.readouterr().err
    model = tmp_path / "sop"
    sopfast.SOP(_cnn(), num_groups=3, task="regression", feature_layer=FEATURE_LAYER).save_pretrained(model)
    loaded = ["--checkpoint", str(model), "--backbone", str(backbone), "--trust-pickle", "--data", str(folder)]
    assert main(["predict", *loaded, "--output-dir", str(tmp_path / "p"), "--no-progress"]) == 0
    rows = pq.read_table(tmp_path / "p" / "data").to_pydict()
    assert len(rows["id"]) == 12 and rows["label"] == [None] * 12


def test_train_on_the_builtin_weak_lensing_maps(tmp_path, capsys):
    backbone = tmp_path / "cnn.pt"
    torch.save(_cnn(), backbone)
    argv = ["train", "--backbone", str(backbone), "--trust-pickle", "--task", "regression"]
    argv += ["--feature-layer", FEATURE_LAYER, "--data", "weak-lensing", "--limit", "8", "--val-limit", "4"]
    assert main([*argv, "--output-dir", str(tmp_path / "run"), *FAST]) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "last").is_dir()
