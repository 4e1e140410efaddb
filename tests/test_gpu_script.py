"""bench/gpu_script.py --dry-run: every step of the GPU script on tiny shapes on the CPU, in order, the
Markdown and summary.json written (issue #29 item 4)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_script.py"


@pytest.fixture
def gpu_script(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the script adds --dry-run for bench/gpu_report.py
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", ":".join(sys.path))
    spec = importlib.util.spec_from_file_location("gpu_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_runs_every_step_in_order(gpu_script, tmp_path):
    assert gpu_script.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    text = (tmp_path / "dry_run_gpu_script.md").read_text()
    assert text.startswith("# sopfast GPU script — CPU") and gpu_script.LEASE_COMMAND in text
    assert ", 0 FAIL, 0 error," in text
    rows = [line.split(" | ")[0].strip("| ") for line in text.splitlines() if line.startswith("| ")]
    first = [rows.index(step) for step in ("probe and op checks", "gates", "CUDA test items", "sync-debug")]
    first += [rows.index(step) for step in ("ViT training", "BERT training", "kernels", "compile")]
    assert first == sorted(first), rows
    for check in ("sign-bit NaN sort probe", "top_tau d=49", "sparsemax cpp", "gather_tokens cpp past 2^31"):
        assert check in text
    for check in ("vit fp32 parity (TF32 off)", "bert bf16 calibrated against the authors' bf16"):
        assert check in text
    for variant in ("| eager |", "| bf16 backbone |", "| bf16 backbone, compile=True |"):  # the compile step
        assert variant in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert tuple(summary) == gpu_script.SUMMARY_KEYS
    assert summary["op_checks_failed"] == 0 and summary["vit_b16_drop_forward_b128_images_per_s"] is None


def test_the_markdown_is_written_after_every_step(gpu_script, tmp_path, monkeypatch):
    """A lease cut off mid-run keeps every step that finished; unknown steps are refused."""
    seen = []

    def first(script):
        script.report.run("gates", "first", lambda: "measured")

    def second(script):
        seen.append((tmp_path / "dry_run_gpu_script.md").read_text())

    monkeypatch.setattr(gpu_script, "STEPS", {"gates": first, "kernels": second})
    assert gpu_script.main(["--dry-run", "--out-dir", str(tmp_path), "--steps", "gates,kernels"]) == 0
    assert "| gates | first | ok | measured |" in seen[0]
    assert gpu_script.main(["--dry-run", "--steps", "gates,speed"]) == 2


def test_pytest_summaries_are_read(gpu_script):
    counts = gpu_script.pytest_counts("=== 3 failed, 387 passed, 2 skipped in 61.2s ===")
    assert counts == {"failed": 3, "passed": 387, "skipped": 2}


def test_the_committed_summary_has_every_key(gpu_script):
    """bench/gpu/summary.json, read by tools: every key, null where no GPU run has measured it."""
    summary = json.loads((SCRIPT.parent / "gpu" / "summary.json").read_text())
    assert tuple(summary) == gpu_script.SUMMARY_KEYS
