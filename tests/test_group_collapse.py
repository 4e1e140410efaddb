"""Training counts the different groups per input (each step and each evaluation) and warns at the end when
they collapsed to fewer than half of the model's groups (issue #41)."""

from __future__ import annotations

import csv
import json
import logging

import pytest
import torch
from torch.utils.data import TensorDataset

import sopfast
from sopfast.model.group_counts import distinct_rows
from sopfast.testing import make_hf_vit
from sopfast.training.collapse import LAST_STEPS, collapsed_groups

X = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
Y = torch.tensor([0, 1, 2, 0, 1, 2])


class Said(logging.Handler):
    """The warnings ``sopfast.training`` logs, each once: a handler on that logger itself, as the ``sopfast``
    logger stops propagating once a CLI test ran (``sopfast.cli.common.configure_logging``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def trained(tmp_path, caplog, tau: float, val: bool = True) -> tuple[sopfast.SOP, object, list[str]]:
    """SOP with 4 groups trained one epoch at ``tau``; the model, the result and its collapse warnings."""
    torch.manual_seed(0)
    sop = sopfast.SOP(make_hf_vit(), num_groups=4, tau=tau)
    logger, said = logging.getLogger("sopfast.training"), Said()
    logger.addHandler(said)
    try:
        with caplog.at_level(logging.WARNING, logger="sopfast.training"):
            result = sopfast.train(
                sop,
                TensorDataset(X, Y),
                TensorDataset(X, Y) if val else None,
                epochs=1,
                batch_size=3,
                output_dir=tmp_path / "run",
                progress=False,
                diagnose=False,
            )
    finally:
        logger.removeHandler(said)
    return sop, result, [m for m in said.messages if "groups collapsed" in m]


def test_distinct_rows_by_hand():
    a, b = [1, 0, 0], [0, 1, 0]
    masks = torch.tensor([[a, b, a], [a, a, a], [a, b, [0, 0, 1]]], dtype=torch.bool)
    assert distinct_rows(masks).tolist() == [2, 1, 3]
    used = torch.tensor([[False, True, True], [True, True, True], [False, False, False]])
    assert distinct_rows(masks, used).tolist() == [2, 1, 0]


def test_groups_that_are_one_by_construction_are_counted_and_warned_about(tmp_path, caplog):
    # τ = 1: every group holds every patch, so the 4 groups are one
    _, result, warnings = trained(tmp_path, caplog, tau=1.0)
    assert result.metrics["val_distinct_groups"] == 1.0
    (warning,) = warnings
    assert "1.0 different groups of 4" in warning and "at the last evaluation" in warning
    assert "diversity_weight (this run: 8)" in warning
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    train_counts = [r["distinct_groups"] for r in records if r["event"] == "train"]
    assert train_counts == [1.0, 1.0]
    with open(tmp_path / "run" / "metrics.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["val_distinct_groups"]) for r in rows if r["event"] == "eval"] == [1.0]
    card = (tmp_path / "run" / "best" / "README.md").read_text()
    assert "distinct groups per input (of 4) 1.0000" in card


def test_without_validation_data_the_last_training_steps_are_counted(tmp_path, caplog):
    _, _, (warning,) = trained(tmp_path, caplog, tau=1.0, val=False)
    assert "over the last 2 training steps" in warning


def test_distinct_groups_are_not_warned_about_and_match_evaluate(tmp_path, caplog):
    sop, result, warnings = trained(tmp_path, caplog, tau=0.2)
    assert warnings == []
    evaluated = sopfast.evaluate(sop, [(X, Y)], metrics=["diversity"], progress=False)
    assert result.metrics["val_distinct_groups"] == pytest.approx(evaluated["SOP"]["distinct_groups"])
    assert result.metrics["val_distinct_groups"] > 2.0


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([{"event": "eval", "val_distinct_groups": 3.9}], "at the last evaluation an input held 3.9"),
        ([{"event": "eval", "val_distinct_groups": 4.0}], None),
        ([{"event": "eval", "val_distinct_groups": 1.0}, {"event": "eval", "val_distinct_groups": 6.0}], None),
        ([{"event": "train", "distinct_groups": 6.0}, {"event": "eval", "val_distinct_groups": 2.0}], "held 2.0"),
        (
            [{"event": "train", "distinct_groups": 8.0}] + [{"event": "train", "distinct_groups": 2.0}] * LAST_STEPS,
            f"over the last {LAST_STEPS} training steps an input held 2.0",
        ),
        ([{"event": "train", "loss": 1.0}], None),
        ([], None),
    ],
)
def test_the_collapse_rule_on_records(records, expected):
    message = collapsed_groups(records, num_groups=8, diversity_weight=2.0)
    if expected is None:
        assert message is None
    else:
        assert expected in message and "of 8" in message and "(this run: 2)" in message
