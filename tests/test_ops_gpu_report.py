"""bench/gpu_report.py --dry-run: the GPU report's checks, timings, end-to-end runs and CPU/device
agreement on tiny shapes on the CPU, through the same code paths as on a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPORT = Path(__file__).resolve().parents[1] / "bench" / "gpu_report.py"


@pytest.fixture(scope="module")
def gpu_report():
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("gpu_report", REPORT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_dry_run_writes_a_clean_report(gpu_report, tmp_path):
    """The sections bench/gpu_script.py does not run (its dry run, tests/test_gpu_script.py, runs the op
    checks and the gates)."""
    output = tmp_path / "RESULTS_gpu.md"
    assert gpu_report.main(["--dry-run", "--output", str(output), "--sections", "e2e,agreement,timings"]) == 0
    text = output.read_text()
    assert text.startswith("# sopfast GPU report — CPU")
    for section in ("## Checks", "## timings", "## end to end"):
        assert section in text
    assert ", 0 FAIL, 0 error," in text
    assert "vit same weights" in text
    for variant in ("| reference |", "| exact |", "| drop |"):
        assert variant in text


def test_one_failing_check_does_not_stop_the_others(gpu_report, tmp_path):
    import torch

    report = gpu_report.Report(torch.device("cpu"), True, float("inf"))

    def broken() -> str:
        raise RuntimeError("boom")

    def wrong() -> str:
        raise AssertionError("differs")

    report.run("ops", "broken", broken)
    report.run("ops", "wrong", wrong)
    report.run("ops", "fine", lambda: "all equal")
    assert [c.status for c in report.checks] == ["error", "FAIL", "ok"]
    report.deadline = 0.0
    report.run("ops", "late", lambda: "never runs")
    assert report.checks[-1].status == "skipped"
    gpu_report.write_markdown(report, tmp_path / "r.md", 0.0)
    assert "1 ok, 1 FAIL, 1 error, 1 skipped" in (tmp_path / "r.md").read_text()


def test_the_report_is_written_after_every_check(gpu_report, tmp_path):
    """A lease that ends mid-run keeps every check that finished."""
    import torch

    output = tmp_path / "partial.md"
    report = gpu_report.Report(torch.device("cpu"), True, float("inf"), output=output)
    report.run("e2e", "first", lambda: "measured")
    assert "| e2e | first | ok | measured |" in output.read_text()
    report.begin("e2e", 0.0)
    report.run("e2e", "second", lambda: "never runs")
    assert "| e2e | second | skipped | section time budget spent |" in output.read_text()


def test_unknown_sections_are_refused(gpu_report, tmp_path, capsys):
    assert gpu_report.main(["--dry-run", "--sections", "e2e,speed", "--output", str(tmp_path / "r.md")]) == 2
    allowed = "['e2e', 'gates', 'agreement', 'ops', 'timings']"
    assert f"--sections ['speed'] unknown; allowed: {allowed}" in capsys.readouterr().err


def near_tie_case():
    """One row of attention over 6 features, k = 2: the reference keeps 0 and 1; feature 2 lies 1 ulp
    below feature 1 (a near tie), feature 3 far below.  Returns the reference's result and k."""
    import torch

    from sopfast.ops import TopTauResult

    a = torch.tensor([[0.5, 0.2, 0.0, 0.1, 0.1, 0.1]])
    a[0, 2] = torch.nextafter(a[0, 1], torch.tensor(0.0))
    reference_mask = torch.tensor([[True, True, False, False, False, False]])
    reference = TopTauResult(torch.tensor([[0, 1]]), reference_mask, torch.zeros(1), a)
    return reference, torch.tensor([2])


def test_a_group_may_differ_from_the_reference_only_at_near_ties(gpu_report):
    import torch

    reference, k = near_tie_case()
    at_near_tie = torch.tensor([[True, False, True, False, False, False]])
    far = torch.tensor([[True, False, False, True, False, False]])
    assert not gpu_report.rows_beyond_near_ties(at_near_tie, reference, k, None, largest=True).any()
    assert gpu_report.rows_beyond_near_ties(far, reference, k, None, largest=True).all()


def test_the_authors_rule_is_checked_on_the_kernels_own_attention(gpu_report):
    import torch

    attention = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.1]])
    k = torch.tensor([2])
    # equal values: the higher index first (largest), the lower index first (smallest)
    assert gpu_report.authors_mask(attention, k, None, largest=True).tolist() == [[False, True, True, False, False]]
    smallest = gpu_report.authors_mask(attention, k, None, largest=False).tolist()
    assert smallest == [[True, False, False, False, True]]
    valid = torch.tensor([[True, True, False, True, True]])
    assert gpu_report.authors_mask(attention, k, valid, largest=True).tolist() == [[False, True, False, True, False]]


def test_the_launch_sweep_varies_knobs_the_kernels_read(gpu_report):
    """Each swept constant changes the launch shape its op's Triton wrapper computes (no GPU needed)."""
    pytest.importorskip("triton")
    import sop_kernels.sparsemax as triton_sparsemax
    import sop_kernels.top_tau as triton_top_tau

    shape_of = {
        ("top_tau", "ROWS_PER_PROGRAM"): lambda: triton_top_tau._forward_shape(65536, 196, 4)["ROWS"],
        ("top_tau", "RADIX_BITS"): lambda: triton_top_tau.radix_args(196)["RADIX"],
        ("sparsemax", "THREAD_ROWS_PER_PROGRAM"): lambda: triton_sparsemax._thread_rows_shape(65536, 20, 4)["ROWS"],
    }
    modules = {"top_tau": triton_top_tau, "sparsemax": triton_sparsemax}
    swept = {(op, knob) for op, knobs in gpu_report.SWEEP_KNOBS.items() for knob in knobs}
    assert swept == set(shape_of)
    for op, settings in gpu_report.sweep_points():
        with gpu_report.knobs_set(modules[op], settings):
            assert all(shape_of[op, knob]() == value for knob, value in settings.items()), (op, settings)
    assert len(gpu_report.sweep_points()) == 4 * 3 + 4
