"""The README's charts draw only numbers that stand in the committed results files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _charts():
    if "sopfast_bench_charts" not in sys.modules:
        spec = importlib.util.spec_from_file_location("sopfast_bench_charts", ROOT / "bench" / "charts.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["sopfast_bench_charts"]


def test_every_bar_is_quoted_from_its_results_file():
    charts = _charts()
    for bar in charts.SPEED:
        text = (ROOT / bar.source).read_text(encoding="utf-8")
        assert bar.quoted in text, (bar, "quoted text not found")
        shown = {f"{bar.ratio:g}×", f"{bar.ratio:.2f}×", f"{bar.ratio:.2f}", f"{bar.ratio:g}"}
        assert any(s in bar.quoted for s in shown), (bar, "the ratio is not in the quoted text")


def test_the_charts_are_drawn(tmp_path):
    for draw in (_charts().speed_chart, _charts().quality_chart):
        path = draw(str(tmp_path / "chart.png"))
        assert Path(path).stat().st_size > 10_000


def test_the_quality_chart_reads_the_committed_research():
    charts = _charts()
    rows = charts.quality_rows()
    assert rows[("plain", "SOP, 0.6.1 recipe|agreement")] and rows[("plain", "SOP, 0.5.3 recipe|agreement")]
    assert all(0 <= v <= 1 for values in rows.values() for v in values)
