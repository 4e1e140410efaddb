"""``sopfast.predict``: a dataset through SOP (or a backbone and an explainer) into Parquet shards that
``datasets`` reads; resumable after kill -9, the same rows under torchrun, bad input in one line."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from predict_worker import SHARD, make_data, make_model, run
from torch.utils.data import Dataset, TensorDataset

import sopfast
from sopfast.testing import make_bert, make_hf_vit, text_batch

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
WORKER_ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(TESTS), os.environ.get("PYTHONPATH", "")]),
}


def read(out: Path):
    """The output directory as one table, as ``datasets`` reads it."""
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_dataset("parquet", data_dir=str(out), cache_dir=str(out.parent / "hf-cache"))["train"]


def shard_tables(out: Path) -> dict[str, object]:
    return {p.name: pq.read_table(p) for p in sorted((out / "data").glob("*.parquet"))}


def test_rows_hold_the_model_outputs_and_datasets_reads_them(tmp_path):
    model, data = make_model(), make_data(10)
    result = sopfast.predict(model, data, tmp_path / "out", batch_size=3, shard_size=4, progress=False)
    assert (result.rows, result.shards_written, result.skipped) == (10, 3, 0)
    rows = read(tmp_path / "out")
    with torch.no_grad():
        out = model(data.tensors[0])
    assert rows["id"] == list(range(10)) and rows["label"] == data.tensors[1].tolist()
    assert rows["prediction"] == out.logits.argmax(-1).tolist()
    np.testing.assert_allclose(np.array(rows["logits"]), out.logits.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(rows["group_scores"]), out.group_scores.numpy(), atol=1e-6)
    np.testing.assert_allclose(np.array(rows["group_logits"]), out.group_logits.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(rows["lam"]), out.lam.numpy(), atol=1e-6)
    assert rows["groups"] == out.group_indices.tolist()  # images: k features in every group, no padding
    used = [torch.nonzero(out.group_scores[i, p] > 0).flatten().tolist() for i, p in enumerate(rows["prediction"])]
    assert rows["used_groups"] == used
    assert rows["source"] == [None] * 10 and "attributions" not in rows.column_names
    card = (tmp_path / "out" / "README.md").read_text()
    assert "10 of 10 examples in 3 Parquet shards" in card and "| `group_scores` |" in card
    import datasets
    import pandas as pd

    by_card = datasets.load_dataset(str(tmp_path / "out"), cache_dir=str(tmp_path / "hf-cache"))["train"]
    assert by_card["id"] == list(range(10)) and len(pd.read_parquet(tmp_path / "out" / "data")) == 10


def test_regression_targets_are_float_labels_without_a_prediction(tmp_path):
    model = sopfast.SOP(make_hf_vit(num_labels=1), num_groups=3, task="regression")
    x = make_data(4).tensors[0]
    y = torch.linspace(-1, 1, 4)
    sopfast.predict(model, TensorDataset(x, y), tmp_path / "out", progress=False)
    rows = read(tmp_path / "out")
    assert "prediction" not in rows.column_names and "used_groups" not in rows.column_names
    np.testing.assert_allclose(rows["label"], y.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(np.array(rows["logits"]), model(x).logits.numpy(), rtol=1e-5, atol=1e-6)


def test_text_groups_are_ragged_lists_without_padding(tmp_path):
    model = sopfast.SOP(make_bert(), num_groups=3, tau=0.3, mode="drop")
    ids, mask, types = text_batch()
    data = [{"input_ids": i, "attention_mask": m, "token_type_ids": t} for i, m, t in zip(ids, mask, types)]
    sopfast.predict(model, data, tmp_path / "out", batch_size=2, progress=False)
    rows = read(tmp_path / "out")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    expected = [[[int(f) for f in g if f >= 0] for g in example] for example in out.group_indices]
    assert rows["groups"] == expected and rows["label"] == [None] * len(data)
    assert len({len(g) for example in expected for g in example}) > 1  # examples keep different counts


def test_attributions_per_feature_and_per_pixel(tmp_path):
    model, data = make_model(), make_data(4)
    for shape, width in (("features", 16), ("input", 32)):
        out = tmp_path / shape
        sopfast.predict(model, data, out, outputs=["attributions"], attribution_shape=shape, progress=False)
        rows = read(out)
        assert rows.column_names == ["id", "source", "label", "prediction", "attributions"]
        values = np.array(rows["attributions"])
        assert values.shape == ((4, 16) if shape == "features" else (4, 32, 32))
        assert values.shape[-1] == width
    with torch.no_grad():
        full = model(data.tensors[0]).feature_attributions()
    np.testing.assert_allclose(np.array(read(tmp_path / "features")["attributions"]), full.numpy(), atol=1e-6)


def test_object_fraction_and_the_docs_queries_run(tmp_path, monkeypatch):
    model = make_model()
    x, y = make_data(8).tensors
    masks = torch.zeros(8, 32, 32, dtype=torch.bool)
    masks[:, :16] = True  # the top half of every image is the object
    sopfast.predict(model, TensorDataset(x, y, masks), tmp_path / "OUT", progress=False)
    rows = read(tmp_path / "OUT")
    with torch.no_grad():
        out = model(x)
    top = torch.zeros(16, dtype=torch.bool)
    top[:8] = True  # the 4×4 patch grid's top two rows
    expected = (out.group_masks & top).sum(-1) / out.group_masks.sum(-1)
    np.testing.assert_allclose(np.array(rows["object_fraction"]), expected.numpy(), atol=1e-6)
    docs = (ROOT / "docs" / "predict.md").read_text()
    code = re.search(r"```python\n(import pandas.*?)```", docs, re.S).group(1)
    card = (tmp_path / "OUT" / "README.md").read_text()
    assert code.strip() in card  # the card shows the docs' queries
    names: dict = {}
    monkeypatch.chdir(tmp_path)
    exec(code, names)
    df = names["df"]
    assert len(df) == 8 and set(names["sizes"].index) <= set(range(3))
    assert (names["sizes"]["group_size"] == 4).all()
    off = [i for i, (f, used) in enumerate(zip(expected, rows["used_groups"])) if any(f[g] < 0.5 for g in used)]
    assert names["off"].id.tolist() == off
    assert names["single"].id.tolist() == [r for r, used in enumerate(rows["used_groups"]) if len(used) == 1]


@pytest.mark.parametrize("mode", [None, "exact"])
def test_rise_attributions_equal_sopfast_rise(tmp_path, mode):
    model, data = make_model(), make_data(5)
    options = {"num_masks": 12, "cells": 2}
    sopfast.predict(
        model,
        data,
        tmp_path / "out",
        batch_size=2,
        explainer="rise",
        explainer_options=options,
        mode=mode,
        progress=False,
    )
    rows = read(tmp_path / "out")
    x = data.tensors[0]
    moded = {} if mode is None else {"mode": mode}
    for i, target in enumerate(rows["prediction"]):
        expected = sopfast.rise(model, x[i : i + 1], torch.tensor([target]), seed=0, **moded, **options)
        np.testing.assert_allclose(rows["rise_attributions"][i], expected[0].numpy(), atol=1e-6)


@pytest.mark.parametrize("explainer", ["kernelshap", "lime", "occlusion"])
def test_captum_explainers_over_a_plain_backbone_do_not_depend_on_the_batch(tmp_path, explainer):
    backbone = make_hf_vit()
    data = TensorDataset(make_data(4).tensors[0])
    options = {} if explainer == "occlusion" else {"n_samples": 8}
    tables = []
    for batch_size in (1, 4):
        out = tmp_path / f"b{batch_size}"
        sopfast.predict(
            backbone, data, out, batch_size=batch_size, explainer=explainer, explainer_options=options, progress=False
        )
        tables.append(read(out))
    assert tables[0].column_names == ["id", "source", "label", "prediction", "logits", f"{explainer}_attributions"]
    np.testing.assert_allclose(
        np.array(tables[0][f"{explainer}_attributions"]), np.array(tables[1][f"{explainer}_attributions"]), atol=1e-5
    )
    with torch.no_grad():
        assert tables[0]["prediction"] == backbone(data.tensors[0]).logits.argmax(-1).tolist()


@contextlib.contextmanager
def one_thread():
    """One intra-op thread, as the workers run (the same float sums, bit for bit)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _worker(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(TESTS / "predict_worker.py"), "--out", str(out), *extra]


def test_kill_9_then_rerun_gives_the_rows_of_an_uninterrupted_run(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(_worker(out, "--hang-writing", "3"), env=WORKER_ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "hanging"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    half = list((out / "data").glob(".*.tmp"))
    assert len(half) == 1 and "00003" in half[0].name  # shard 3 half-written
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "data").glob("*.parquet")}
    assert sorted(kept) == [f"train-0000{s}-of-00006.parquet" for s in range(3)]

    with one_thread():
        result = run(out)
        run(tmp_path / "ref")
    assert (result.shards_kept, result.shards_written, result.rows) == (3, 3, 22 - 3 * SHARD)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "data").glob("*.parquet") if p.name in kept} == kept
    assert not list((out / "data").glob(".*"))
    reference_tables, resumed = shard_tables(tmp_path / "ref"), shard_tables(out)
    assert list(resumed) == list(reference_tables)
    assert all(resumed[name].equals(reference_tables[name]) for name in resumed)
    again = run(out)
    assert (again.shards_written, again.shards_kept, again.rows) == (0, 6, 0)


def test_another_model_data_or_settings_is_refused(tmp_path):
    out = tmp_path / "out"
    data = make_data(6)
    sopfast.predict(make_model(), data, out, progress=False)
    other = sopfast.SOP(make_hf_vit(seed=1), num_groups=4, tau=0.25, mode="drop")
    with pytest.raises(ValueError, match=r"holds predictions of another run \(model differ"):
        sopfast.predict(other, data, out, progress=False)
    x, y = data.tensors
    with pytest.raises(ValueError, match=r"\(data differ"):
        sopfast.predict(make_model(), TensorDataset(x.flip(0), y), out, progress=False)
    with pytest.raises(ValueError, match=r"\(model, settings differ"):
        sopfast.predict(make_model(), data, out, outputs=["logits"], progress=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"is not empty and holds no predict\.json"):
        sopfast.predict(make_model(), data, tmp_path / "full", progress=False)
    with pytest.raises(ValueError, match="is a file; give a directory"):
        sopfast.predict(make_model(), data, tmp_path / "full" / "notes.txt", progress=False)


class _Unreadable(Dataset):
    """``make_data(6)`` with examples 1 and 4 raising as an unreadable file does."""

    def __init__(self):
        self.data = make_data(6)
        self.sources = [f"img{i}.png" for i in range(6)]

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i in (1, 4):
            raise OSError(f"cannot read the image img{i}.png: truncated\nsecond line")
        return self.data[i]


@pytest.mark.parametrize("workers", [0, 1])
def test_unreadable_examples_are_skipped_and_listed_or_stop_a_strict_run(tmp_path, workers):
    result = sopfast.predict(
        make_model(), _Unreadable(), tmp_path / "out", shard_size=4, num_workers=workers, progress=False
    )
    rows = read(tmp_path / "out")
    assert rows["id"] == [0, 2, 3, 5] and rows["source"] == ["img0.png", "img2.png", "img3.png", "img5.png"]
    assert result.skipped == 2 and result.skipped_file == str(tmp_path / "out" / "skipped.tsv")
    assert (tmp_path / "out" / "skipped.tsv").read_text().splitlines() == [
        "id\tsource\terror",
        "1\timg1.png\tcannot read the image img1.png: truncated",
        "4\timg4.png\tcannot read the image img4.png: truncated",
    ]
    assert "4 of 6 examples" in (tmp_path / "out" / "README.md").read_text()
    with pytest.raises(ValueError, match=r"^example 1 \(img1.png\) cannot be read: cannot read the image img1.png"):
        sopfast.predict(make_model(), _Unreadable(), tmp_path / "strict", strict=True, progress=False)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"outputs": ["logits", "colour"]}, "outputs must be one of"),
        ({"explainer": "gradcam"}, "explainer must be one of"),
        ({"explainer": "rise", "explainer_options": {"n_samples": 4}}, r"\['n_samples'\] are not options of 'rise'"),
        ({"explainer_options": {"num_masks": 4}}, "given without an explainer"),
        ({"batch_size": 0}, "batch_size must be an integer ≥ 1"),
        ({"shard_size": 0}, "shard_size must be an integer ≥ 1"),
        ({"mode": "fast"}, "mode"),
        ({"attribution_shape": "pixels"}, "attribution_shape must be one of"),
    ],
)
def test_bad_arguments_name_themselves(tmp_path, kwargs, error):
    with pytest.raises(ValueError, match=error):
        sopfast.predict(make_model(), make_data(2), tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_backbone_writes_no_sop_columns(tmp_path):
    with pytest.raises(ValueError, match=r"outputs \['groups'\] need a SOP model"):
        sopfast.predict(make_hf_vit(), make_data(2), tmp_path / "out", outputs=["groups"], progress=False)
    with pytest.raises(ValueError, match="dataset is empty"):
        sopfast.predict(make_model(), make_data(0), tmp_path / "out", progress=False)


def test_progress_bar_and_summary_line(tmp_path, capsys):
    sopfast.predict(make_model(), make_data(4), tmp_path / "out")
    err = capsys.readouterr().err
    assert "ex/s" in err
    assert re.search(r"sopfast: predicted 4 examples in [\d.]+ s \([\d.]+ examples/s\); 1 shards written", err)
