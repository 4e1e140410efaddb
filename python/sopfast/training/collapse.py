"""The end-of-training warning when SOP's groups collapsed: the inputs hold far fewer different groups than
the model has, so its explanations use fewer groups than it reports (issue #41: the text recipe's groups
became one on MiniLM at one seed of three)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Fewer different groups per input than this share of the model's groups is a collapse.
COLLAPSED_SHARE = 0.5
#: Without validation data, the count is the mean over this many last train records.
LAST_STEPS = 10


def collapsed_groups(records: Sequence[dict[str, Any]], num_groups: int, diversity_weight: float) -> str | None:
    """In words, when the different groups per input at the end of a run fell below :data:`COLLAPSED_SHARE`
    of ``num_groups``: the last evaluation's ``val_distinct_groups`` in ``records`` (the run's log), else the
    mean ``distinct_groups`` of its last :data:`LAST_STEPS` train records; ``None`` when they did not, or
    without either."""
    evals = [r["val_distinct_groups"] for r in records if r.get("event") == "eval" and "val_distinct_groups" in r]
    train = [r["distinct_groups"] for r in records if r.get("event") == "train" and "distinct_groups" in r]
    if evals:
        count, where = evals[-1], "at the last evaluation"
    elif train:
        last = train[-LAST_STEPS:]
        count, where = sum(last) / len(last), f"over the last {len(last)} training steps"
    else:
        return None
    if count >= COLLAPSED_SHARE * num_groups:
        return None
    return (
        f"SOP's groups collapsed: {where} an input held {count:.1f} different groups of {num_groups} on "
        f"average (fewer than half), so its explanations rest on fewer groups than it has. Train again with "
        f"another seed or a larger diversity_weight (this run: {diversity_weight:g}), and check the groups with "
        '`sopfast evaluate --metrics diversity` (docs/training.md, "When the groups collapse")'
    )
