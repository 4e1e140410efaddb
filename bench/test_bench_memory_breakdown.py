"""Smoke test of ``bench/training_memory_breakdown.py`` on a tiny ViT (batch 2, both variants)."""

from __future__ import annotations

import sys
from pathlib import Path

from sopfast import testing

sys.path.insert(0, str(Path(__file__).parent))
from training_memory_breakdown import main

# RSS is read in pages and includes the profiler's own buffers; the allocator's live bytes are exact
TOLERANCE_MIB = 16.0


def test_parts_are_non_negative_and_fit_the_total():
    backbone = testing.vit((32, 2, 2), image_size=32, patch_size=8, num_labels=2)
    results = main(["--batch", "2", "--image-size", "32"], backbone=backbone)
    assert set(results) == {"drop", "authors"}
    for parts in results.values():
        sizes = {k: v for k, v in parts.items() if not isinstance(v, str)}
        assert all(v >= 0 for v in sizes.values()), sizes
        fixed = sum(sizes[k] for k in sizes if k[:3] in ("(a)", "(b)", "(d)"))
        kept = sum(sizes[k] for k in sizes if k.endswith("saved for backward"))
        peak = sizes["process RSS before the step"] + sizes["step peak above its start (RSS, the total)"]
        assert fixed + kept <= peak + TOLERANCE_MIB
        assert kept <= sizes["forward: live at its end above its start"] + TOLERANCE_MIB
        assert sizes["(c) their gradients"] == sizes["(b) trainable parameters"]
