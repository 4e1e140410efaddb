"""Predictions that prove themselves (issue #42): each shard's SHA-256 and row ids are recorded in
``predict.json``; a resume recomputes every shard that does not match its record (a flipped byte, a
truncated or copied file), saying which, and ends with the rows of an uninterrupted run; a damaged
``predict.json`` is one clear error; files the tool did not make are left alone; and a hostile caller
gets one clear error naming the argument or file, or a correct result."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
from predict_worker import EXAMPLES, SHARD, make_data, make_model, run
from test_predict import TESTS, WORKER_ENV, _Unreadable, one_thread, shard_tables
from torch.utils.data import IterableDataset, TensorDataset
from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

import sopfast
import user_data as U
from sopfast.cli.app import main
from sopfast.integrity import sha256_bytes
from sopfast.prediction.loading import ShardPlan
from sopfast.prediction.store import OutputDir
from sopfast.testing import make_hf_vit

SHARDS = -(-EXAMPLES // SHARD)
NAMES = [f"train-{s:05d}-of-{SHARDS:05d}.parquet" for s in range(SHARDS)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """An uninterrupted run of the worker's model over its data: 6 shards (4 examples each, the last 2)."""
    out = tmp_path_factory.mktemp("predict") / "finished"
    with one_thread():
        run(out)
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "out"))


@contextlib.contextmanager
def _warnings(caplog) -> Iterator[list[str]]:
    """The warning lines the ``sopfast`` loggers give inside the block (the CLI may have stopped their
    propagation to the root logger)."""
    logger = logging.getLogger("sopfast")
    propagate, logger.propagate = logger.propagate, False  # each record once, to caplog's handler alone
    logger.addHandler(caplog.handler)
    lines: list[str] = []
    try:
        with caplog.at_level(logging.WARNING, logger="sopfast"):
            yield lines
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate
        lines += [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _resume(out: Path, caplog) -> tuple[sopfast.PredictResult, list[str]]:
    with one_thread(), _warnings(caplog) as lines:
        result = run(out)
    return result, lines


def _assert_rows_of(out: Path, finished: Path) -> None:
    """``out`` holds the shards of the uninterrupted run, and its dataset every id once."""
    resumed, reference = shard_tables(out), shard_tables(finished)
    assert list(resumed) == list(reference) == NAMES
    assert all(resumed[name].equals(reference[name]) for name in NAMES)
    assert pq.read_table(out / "data").column("id").to_pylist() == list(range(EXAMPLES))


def _flip(path: Path, at: float) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES: dict[str, Callable[[Path], None]] = {
    "a byte flipped at 5 %": lambda p: _flip(p, 0.05),
    "a byte flipped at 20 %": lambda p: _flip(p, 0.20),
    "truncated to half": lambda p: os.truncate(p, p.stat().st_size // 2),
    "shard 0 copied over shard 1": lambda p: shutil.copyfile(p.with_name(NAMES[0]), p),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_resume_recomputes_a_damaged_shard_and_ends_with_the_rows_of_an_uninterrupted_run(
    finished, tmp_path, caplog, damage
):
    out = _copy(finished, tmp_path)
    shard = out / "data" / NAMES[1]
    DAMAGES[damage](shard)
    others = {n: (out / "data" / n).stat().st_mtime_ns for n in NAMES if n != NAMES[1]}
    result, lines = _resume(out, caplog)
    assert (result.shards_written, result.shards_kept, result.rows) == (1, SHARDS - 1, SHARD)
    assert lines == [f"{shard}: its SHA-256 differs from the recorded one (the file was changed or damaged); "
                     "computing it again"]  # fmt: skip
    assert {n: (out / "data" / n).stat().st_mtime_ns for n in others} == others  # proven shards are kept
    _assert_rows_of(out, finished)
    assert json.loads((out / "predict.json").read_text()) == json.loads((finished / "predict.json").read_text())


def _edit_record(out: Path, edit: Callable[[dict], None]) -> None:
    manifest = json.loads((out / "predict.json").read_text())
    edit(manifest["records"])
    (out / "predict.json").write_text(json.dumps(manifest))


RECORD_DAMAGES = {
    "no record (killed between the shard and its record)": (lambda r: r.pop(NAMES[3]), "it has no record in"),
    "another SHA-256": (lambda r: r[NAMES[3]].update(sha256="0" * 64), "its SHA-256 differs from the recorded one"),
    "other ids": (lambda r: r[NAMES[3]].update(ids=[[0, 4]]), "its example ids differ from the recorded ones"),
    "a malformed record": (lambda r: r[NAMES[3]].update(ids="all"), "its record in predict.json is malformed"),
}


@pytest.mark.parametrize("damage", list(RECORD_DAMAGES))
def test_a_shard_that_its_record_does_not_prove_is_computed_again(finished, tmp_path, caplog, damage):
    out = _copy(finished, tmp_path)
    edit, reason = RECORD_DAMAGES[damage]
    _edit_record(out, edit)
    result, lines = _resume(out, caplog)
    assert (result.shards_written, result.shards_kept) == (1, SHARDS - 1)
    (line,) = lines
    assert line.startswith(f"{out / 'data' / NAMES[3]}: {reason}") and line.endswith("; computing it again")
    _assert_rows_of(out, finished)
    assert (
        json.loads((out / "predict.json").read_text())["records"]
        == json.loads((finished / "predict.json").read_text())["records"]
    )


def test_predict_json_records_each_shards_sha256_and_ids_and_skipped_examples_stay_proven(finished, tmp_path, caplog):
    records = json.loads((finished / "predict.json").read_text())["records"]
    assert list(records) == NAMES
    for s, name in enumerate(NAMES):
        assert records[name] == {
            "sha256": sha256_bytes((finished / "data" / name).read_bytes()),
            "ids": [[s * SHARD, min((s + 1) * SHARD, EXAMPLES)]],
        }
    assert sorted(p.name for p in finished.iterdir()) == ["README.md", "data", "predict.json"]  # no record files

    out = tmp_path / "holes"  # examples 1 and 4 cannot be read: the ids have holes
    sopfast.predict(make_model(), _Unreadable(), out, shard_size=4, num_workers=0, progress=False)
    records = json.loads((out / "predict.json").read_text())["records"]
    assert [r["ids"] for r in records.values()] == [[[0, 1], [2, 4]], [[5, 6]]]
    with _warnings(caplog) as lines:
        again = sopfast.predict(make_model(), _Unreadable(), out, shard_size=4, num_workers=0, progress=False)
    assert (again.shards_kept, again.shards_written, lines) == (2, 0, [])
    assert (out / "skipped.tsv").read_text().count("\n") == 3


def test_a_record_that_lies_is_caught_and_the_final_check_refuses_repeated_ids(finished, tmp_path):
    """Shard 0's file and record copied to shard 1: the hash and ids match the record, but they are not
    shard 1's ids; the check at the end of a run names the repeated ids' folder."""
    out = _copy(finished, tmp_path)
    shutil.copyfile(out / "data" / NAMES[0], out / "data" / NAMES[1])
    _edit_record(out, lambda r: r.update({NAMES[1]: r[NAMES[0]]}))
    store = OutputDir(out, ShardPlan(EXAMPLES, SHARD))
    assert store.verify(1, store.records()) == "its rows and skipped examples are not shard 1's ids range(4, 8)"
    with pytest.raises(ValueError, match=r"data do not hold each example id exactly once"):
        store.complete()


@pytest.mark.parametrize(
    "content",
    [b"{garbage", b'{"format": "sopfast-predict/1", "model": "', b"[]", b"\xff\xfe\x00", b""],
    ids=["not JSON", "truncated", "a JSON list", "not UTF-8", "empty"],
)
def test_a_damaged_predict_json_is_one_clear_error_and_nothing_is_touched(finished, tmp_path, content):
    """Without its manifest no shard can prove itself and nothing says which run the directory holds:
    refused, naming the file; the user decides (delete the directory to start again)."""
    out = _copy(finished, tmp_path)
    (out / "predict.json").write_bytes(content)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=f"^{re.escape(str(out / 'predict.json'))} cannot be read .*delete the"):
        run(out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_files_the_tool_did_not_make_are_left_alone(finished, tmp_path, caplog):
    out = _copy(finished, tmp_path)
    mine = {out / "notes.txt": b"mine", out / ".notes.tmp": b"draft", out / "data" / ".keep": b""}
    for path, data in mine.items():
        path.write_bytes(data)
    result, lines = _resume(out, caplog)
    assert (result.shards_kept, lines) == (SHARDS, [])
    assert {p: p.read_bytes() for p in mine} == mine
    _assert_rows_of(out, finished)

    extra = out / "data" / "extra.parquet"  # a reader of data/ would take it for rows
    shutil.copyfile(out / "data" / NAMES[0], extra)
    with pytest.raises(ValueError, match=r"data holds files this run does not write \(\['extra.parquet'\]\)"):
        run(out)
    assert extra.read_bytes() == (out / "data" / NAMES[0]).read_bytes()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_torchrun_ranks_recompute_their_damaged_shards_and_record_them_side_by_side(finished, tmp_path, caplog):
    """Shard 1 belongs to rank 1 and shard 2 to rank 0: each rank recomputes and records its own, rank 0
    gathers both records into predict.json, and a later run in one process proves every shard."""
    out = _copy(finished, tmp_path)
    _flip(out / "data" / NAMES[1], 0.05)
    _flip(out / "data" / NAMES[2], 0.2)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*launch, str(TESTS / "predict_worker.py"), "--out", str(out)],
        env=WORKER_ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "computing it again" in line]
    assert sorted(said) == [f"{out / 'data' / n}: its SHA-256 differs from the recorded one (the file was changed "
                            "or damaged); computing it again" for n in NAMES[1:3]]  # fmt: skip
    _assert_rows_of(out, finished)
    assert json.loads((out / "predict.json").read_text()) == json.loads((finished / "predict.json").read_text())
    result, lines = _resume(out, caplog)
    assert (result.shards_kept, result.shards_written, lines) == (SHARDS, 0, [])


class _Stream(IterableDataset):
    def __iter__(self):
        yield from make_data(2)


#: (keyword arguments, the error, what it says): each names the argument it is about.
HOSTILE = [
    ({"output_dir": None}, TypeError, r"^output_dir must be a path .*got None"),
    ({"output_dir": 123}, TypeError, r"^output_dir must be a path .*got 123"),
    ({"output_dir": ""}, ValueError, r"^output_dir must be a path .*got an empty path"),
    ({"dataset": (x for x in [1])}, TypeError, r"^dataset must be a map-style dataset .*got generator"),
    ({"dataset": _Stream()}, TypeError, r"^dataset must be a map-style dataset .*got _Stream"),
    ({"dataset": "images/"}, TypeError, r"^dataset must be a map-style dataset .*got str"),
    ({"dataset": None}, TypeError, r"^dataset must be a map-style dataset .*got NoneType"),
    ({"dataset": [1, 2]}, ValueError, r"^dataset\[0\] does not fit the model: images must have shape"),
    ({"dataset": {"a": 1}}, TypeError, r"^dataset\[0\] raised KeyError: 0; dataset must give its examples"),
    ({"model": "vit"}, TypeError, r"^model must be a sopfast.SOP or a backbone \(nn.Module\), got str"),
    ({"explainer_options": "num_masks=4"}, TypeError, r"^explainer_options must be a dict"),
    ({"device": "tpu"}, ValueError, r"^device 'tpu' is not a device"),
    ({"device": 3.5}, ValueError, r"^device 3.5 is not a device"),
    ({"ground_truth_key": 1.5}, TypeError, r"^ground_truth_key must be a dict key"),
    ({"description": 5}, TypeError, r"^description must be a str or None, got int"),
]


@pytest.mark.parametrize(
    "kwargs, error, match", HOSTILE, ids=[re.sub(r" at 0x\w+", "", repr(k)) for k, _, _ in HOSTILE]
)
def test_hostile_arguments_get_one_clear_error_naming_them(tmp_path, kwargs, error, match):
    given = {"model": make_model(), "dataset": make_data(2), "output_dir": tmp_path / "out", **kwargs}
    with pytest.raises(error, match=match):
        sopfast.predict(given.pop("model"), given.pop("dataset"), given.pop("output_dir"), progress=False, **given)
    assert not (tmp_path / "out").exists()


def test_hostile_but_valid_inputs_give_correct_results(tmp_path):
    """Unlabelled items give null labels; the card shows only the queries whose columns exist."""
    x = make_data(3).tensors[0]
    sopfast.predict(make_model(), [(image,) for image in x], tmp_path / "plain", progress=False)
    rows = pq.read_table(tmp_path / "plain" / "data").to_pydict()
    assert rows["label"] == [None] * 3 and "object_fraction" not in rows
    card = (tmp_path / "plain" / "README.md").read_text()
    assert "df.object_fraction" not in card and "| `object_fraction` |" not in card  # the data has no masks
    assert "single = df[" in card and "sizes = df.groupby" in card
    sopfast.predict(make_hf_vit(), TensorDataset(x), tmp_path / "backbone", progress=False)
    assert "## Queries" not in (tmp_path / "backbone" / "README.md").read_text()  # logits only: nothing to ask
    with torch.no_grad():
        expected = make_hf_vit()(x).logits.argmax(-1).tolist()
    assert pq.read_table(tmp_path / "backbone" / "data").column("prediction").to_pylist() == expected


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("sopfast predict: error:")]


def _unlabelled(path: Path) -> Path:
    """``path`` (a CSV) without its label column."""
    lines = path.read_text().splitlines()
    assert lines[0].endswith(",label")
    out = path.with_name("unlabelled.csv")
    out.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in lines))
    return out


@pytest.mark.parametrize("kind", ["images", "texts"])
def test_cli_data_without_labels_gives_null_labels_and_a_damaged_manifest_is_one_line(tmp_path, capsys, kind):
    if kind == "images":
        model_dir, csv = U.vit_dir(tmp_path), _unlabelled(U.image_csv(tmp_path))
        backbone = AutoModelForImageClassification.from_pretrained(model_dir)
    else:
        model_dir, csv = U.bert_dir(tmp_path), _unlabelled(U.text_csv(tmp_path))
        backbone = AutoModelForSequenceClassification.from_pretrained(model_dir)
    sopfast.SOP(backbone, num_groups=3, tau=0.25, mode="drop").save_pretrained(tmp_path / "sop")
    common = ["predict", "--backbone", str(model_dir), "--checkpoint", str(tmp_path / "sop"), "--data", str(csv)]
    out = tmp_path / "out"
    argv = [*common, "--output-dir", str(out), "--no-progress", "--batch-size", "4", "--shard-size", "5"]
    extra = ["--object-masks", "intensity"] if kind == "images" else []
    assert main([*argv, *extra]) == 0, capsys.readouterr().err
    rows = pq.read_table(out / "data").to_pydict()
    assert rows["id"] == list(range(12)) and rows["label"] == [None] * 12
    card = (out / "README.md").read_text()
    assert ("object_fraction" in rows) == ("off = df[" in card) == (kind == "images")

    assert main([*common, "--output-dir", str(tmp_path / "held"), "--holdout", "0.25"]) == 2
    (line,) = _errors(capsys)
    assert line.endswith(f"{csv} has no label column, which --holdout (a part held out per class) needs")
    assert main([*common, "--output-dir", str(tmp_path / "mapped"), "--label-map", "cat=0"]) == 2
    (line,) = _errors(capsys)
    assert line.endswith(f"{csv} has no label column, which --label-map needs")

    (out / "predict.json").write_text("{")
    assert main([*argv, *extra]) == 2
    (line,) = _errors(capsys)
    assert f"error: {out / 'predict.json'} cannot be read (JSONDecodeError: " in line
