"""``sopfast demo --task cosmology --quick``: the whole cosmology study on small settings."""

from __future__ import annotations

import contextlib
import json

from sopfast.cli.app import main


def _is_png(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cosmology_demo_quick(tmp_path):
    out = tmp_path / "demo"
    capture = tmp_path / "printed.txt"
    with open(capture, "w") as f, contextlib.redirect_stdout(f):
        assert main(["demo", "--task", "cosmology", "--quick", "--out", str(out), "--device", "cpu"]) == 0
    printed = capture.read_text()
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0, 1] and results["maps"]["test"] == 16
    for name in ("ordinary", "adapted"):
        study = results[name]
        assert set(study["backbone"]["r2"]) == {"Omega_m", "sigma_8"}
        assert study["diagnosis"]["mean_mse"] > 0 and study["diagnosis"]["verdict"]
        comparison = study["comparison"]
        assert comparison["SOP"]["seeds"] == 2 and comparison["Random"]["seeds"] == 2
        assert comparison["GxI-F"]["seeds"] == 1 and "GradCAM-F" in comparison
        for method in ("SOP", "Random", "GxI-F"):
            assert comparison[method]["mse"] >= 0 and 0 <= comparison[method]["purity"] <= 1
            assert "0.6/0.005" in comparison[method]["purity_thresholds"]
        assert {"0.1/1", "0.2/20"} <= set(comparison["SOP"]["curves"])
        assert set(study["rq7"]) == {"void/Omega_m", "void/sigma_8", "cluster/Omega_m", "cluster/sigma_8"}
        assert len(study["rq7_per_seed"]) == 2
        assert len(study["pictures"]) == 2 and all(_is_png(p) for p in study["pictures"])
        assert _is_png(study["curves_png"])
    assert results["adaptation"]["settings"]["task"] == "regression"
    assert (out / "backbone.pt").exists() and (out / "backbone-adapted" / "sopfast_adaptation.json").exists()
    assert (out / "sop" / "sop_config.json").exists() and (out / "sop-adapted" / "sop_config.json").exists()
    assert "## SOP on the CNN as trained" in printed and "## SOP on the adapted copy" in printed
    assert "## Targets" in printed and "RQ7" in printed and "purity" in printed
