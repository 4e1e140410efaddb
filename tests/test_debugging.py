"""Model debugging (paper RQ6): the on-object share of the used groups for correct vs incorrect predictions,
from ``object_ratio`` for every method, from ``sopfast predict``'s output with the pandas recipe of
docs/evaluation.md, and as the image demo's table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import sopfast
from sopfast.demo.debugging import debugging_table
from sopfast.evaluation.evaluate import evaluate
from sopfast.testing import make_hf_vit


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 3, 32, 32, generator=g)
    objects = torch.zeros(12, 32, 32, dtype=torch.bool)
    objects[:, 8:24, 4:20] = True
    return x, torch.arange(12) % 3, objects


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25, mode="exact").eval()


def test_the_pandas_recipe_equals_object_ratio(model, data, tmp_path):
    x, y, objects = data
    dataset = torch.utils.data.TensorDataset(x, y, objects)
    loader = torch.utils.data.DataLoader(dataset, batch_size=6)
    results = evaluate(
        model, loader, metrics=["object_ratio"], ground_truth_key=2, baselines=["random", "gxi-f"], progress=False
    )
    sop = results["SOP"]["object_ratio"]
    assert sop["num_correct"] + sop["num_incorrect"] == 12 and 0 < sop["num_correct"] < 12
    assert {"correct", "incorrect"} <= set(results["GxI-F"]["object_ratio"])
    sopfast.predict(model, dataset, tmp_path / "preds", num_workers=0, progress=False)
    # docs/evaluation.md, "Model debugging"
    df = pd.read_parquet(tmp_path / "preds" / "data")
    df["correct"] = df.prediction == df.label
    df["on_object"] = [
        np.mean([fraction[g] for g in used]) if len(used) else np.nan
        for fraction, used in zip(df.object_fraction, df.used_groups)
    ]
    means = df.groupby("correct").on_object.agg(["mean", "count"])
    assert means.loc[True, "mean"] == pytest.approx(sop["correct"], abs=1e-6)
    assert means.loc[False, "mean"] == pytest.approx(sop["incorrect"], abs=1e-6)
    assert means.loc[True, "count"] == sop["num_correct"]


def test_the_demo_table_lists_every_method_with_the_share():
    comparison = {
        "SOP": {"object_ratio": {"correct": 0.65, "incorrect": 0.57, "num_correct": 80.0, "num_incorrect": 20.0}},
        "Random": {"object_ratio": {"correct": 0.5, "incorrect": float("nan"), "num_correct": 100, "num_incorrect": 0}},
        "Backbone": {"accuracy": 0.9},
    }
    lines = debugging_table(comparison)
    assert lines[-2] == "| SOP | 0.650 | 0.570 | +0.080 | 80 / 20 |"
    assert lines[-1] == "| Random | 0.500 | – | – | 100 / 0 |"
    assert debugging_table({"Backbone": {"accuracy": 0.9}}) == []
