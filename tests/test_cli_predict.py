"""``sopfast predict`` on the data sources every command reads: an image folder (with an unreadable
file), a saved Hugging Face dataset of texts, a CSV of image paths and a built-in set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

import sopfast
import user_data as U
from sopfast.cli.app import main
from sopfast.testing import vit

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--no-progress", "--batch-size", "4", "--shard-size", "5"]


def _checkpoint(backbone, root: Path, **options) -> Path:
    path = root / "sop"
    sopfast.SOP(backbone, num_groups=3, tau=0.25, **options).save_pretrained(path)
    return path


def _shards(out: Path) -> dict:
    return {p.name: pq.read_table(p) for p in sorted((out / "data").glob("*.parquet"))}


def _rows(out: Path):
    return pq.read_table(out / "data").to_pydict()


def _errors(capsys) -> list[str]:
    """The error lines on stderr (the lines before them report what the command loaded)."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("sopfast predict: error:")]


def _run(argv: list[str], capsys) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def _vit_on_folder(tmp_path: Path, per_class: int) -> tuple[list[str], Path, Path]:
    """``--backbone``/``--checkpoint``/``--data`` of a tiny ViT, a SOP over it and an image folder."""
    backbone_dir, images = U.vit_dir(tmp_path), U.image_folder(tmp_path, per_class=per_class)
    checkpoint = _checkpoint(AutoModelForImageClassification.from_pretrained(backbone_dir), tmp_path)
    return (
        ["--backbone", str(backbone_dir), "--checkpoint", str(checkpoint), "--data", str(images)],
        backbone_dir,
        images,
    )


def test_image_folder_whole_split_with_an_unreadable_file(tmp_path, capsys):
    common, backbone_dir, images = _vit_on_folder(tmp_path, 3)
    (images / "dog" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    backbone = AutoModelForImageClassification.from_pretrained(backbone_dir)
    out = tmp_path / "preds"
    assert _run(["predict", *common, "--output-dir", str(out), *FAST], capsys).strip() == str(out)
    rows = _rows(out)
    assert len(rows["id"]) == 8 and rows["id"] == sorted(rows["id"])  # 9 images, one unreadable, nothing held out
    skipped = (out / "skipped.tsv").read_text().splitlines()
    assert len(skipped) == 2 and skipped[1].split("\t")[1].endswith("dog/1.png")
    assert all(Path(s).is_file() for s in rows["source"]) and not any(s.endswith("dog/1.png") for s in rows["source"])

    model = sopfast.SOP.from_pretrained(tmp_path / "sop", backbone).eval()
    from sopfast.adapters.preprocessing import preprocessing_for
    from sopfast.adapters.sources import load_backbone
    from sopfast.data.user_data import load_image

    prep = preprocessing_for(model.adapter, load_backbone(str(backbone_dir)))
    x = torch.stack([prep.image(load_image(s)) for s in rows["source"]])
    with torch.no_grad():
        assert rows["prediction"] == model(x).logits.argmax(-1).tolist()
    names = {"cat": 0, "dog": 1, "owl": 2}
    assert rows["label"] == [names[Path(s).parent.name] for s in rows["source"]]

    code = main(["predict", *common, "--output-dir", str(tmp_path / "strict"), "--strict", *FAST])
    (error,) = _errors(capsys)
    assert code == 2 and "cannot be read" in error and "dog/1.png" in error and "(strict)" in error


def test_saved_text_dataset_csv_of_images_and_a_builtin_set(tmp_path, capsys):
    bert_dir = U.bert_dir(tmp_path)
    bert = AutoModelForSequenceClassification.from_pretrained(bert_dir)
    text = ["--backbone", str(bert_dir), "--checkpoint", str(_checkpoint(bert, tmp_path / "b", mode="drop"))]
    _run(
        ["predict", *text, "--data", str(U.saved_text_dataset(tmp_path)), "--output-dir", str(tmp_path / "t"), *FAST],
        capsys,
    )
    rows = _rows(tmp_path / "t")
    assert len(rows["id"]) == 6 and len(rows["groups"][0]) == 3  # the test split; 3 groups
    assert (tmp_path / "t" / "README.md").read_text().count("6 of 6 examples") == 1

    vit_dir, csv = U.vit_dir(tmp_path), U.image_csv(tmp_path)
    vit_model = AutoModelForImageClassification.from_pretrained(vit_dir)
    images = ["--backbone", str(vit_dir), "--checkpoint", str(_checkpoint(vit_model, tmp_path / "v"))]
    argv = ["predict", *images, "--data", str(csv), "--output-dir", str(tmp_path / "c"), *FAST]
    _run([*argv, "--explainer", "rise", "--explainer-option", "num_masks=4", "--outputs", "logits"], capsys)
    rows = _rows(tmp_path / "c")
    assert len(rows["id"]) == 12 and all(s.endswith(".png") for s in rows["source"])
    assert np.array(rows["rise_attributions"]).shape == (12, 16) and "groups" not in rows

    digits_dir = tmp_path / "digits-vit"
    vit((32, 1, 2), image_size=8, patch_size=2, channels=1, num_labels=10).save_pretrained(digits_dir)
    digits = AutoModelForImageClassification.from_pretrained(digits_dir)
    argv = ["--backbone", str(digits_dir), "--checkpoint", str(_checkpoint(digits, tmp_path / "d")), "--data", "digits"]
    _run(["predict", *argv, "--limit", "7", "--output-dir", str(tmp_path / "d7"), *FAST], capsys)
    assert _rows(tmp_path / "d7")["id"] == list(range(7))


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_torchrun_two_processes_write_the_rows_of_one(tmp_path, capsys):
    """docs/predict.md's torchrun command: 2 gloo processes on the CPU write the shards one process writes."""
    common, _, _ = _vit_on_folder(tmp_path, 4)
    common += ["--batch-size", "2", "--shard-size", "5", "--no-progress", "--device", "cpu"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "sopfast.cli"]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
    }
    two = subprocess.run(
        [*launch, "predict", *common, "--output-dir", str(tmp_path / "two")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stderr.count("test data:") == 1, two.stderr[-3000:]  # rank 0 says what it reads
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each process ran: the same float sums, bit for bit
    try:
        _run(["predict", *common, "--output-dir", str(tmp_path / "one")], capsys)
    finally:
        torch.set_num_threads(threads)
    one, two_tables = _shards(tmp_path / "one"), _shards(tmp_path / "two")
    assert list(one) == list(two_tables) == [f"train-0000{s}-of-00003.parquet" for s in range(3)]
    assert all(one[name].equals(two_tables[name]) for name in one)
    assert _rows(tmp_path / "two")["id"] == list(range(12))


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--explainer", "rise", "--explainer-option", "n_samples=3"], "['n_samples'] are not options of 'rise'"),
        (["--explainer-option", "num_masks=3"], "given without an explainer"),
        (["--shard-size", "0"], "shard_size must be an integer ≥ 1"),
        (["--outputs", "colour"], "invalid choice: 'colour'"),
    ],
)
def test_mistakes_are_one_line(tmp_path, capsys, flags, error):
    backbone_dir = U.vit_dir(tmp_path)
    backbone = AutoModelForImageClassification.from_pretrained(backbone_dir)
    argv = ["--backbone", str(backbone_dir), "--checkpoint", str(_checkpoint(backbone, tmp_path))]
    code = main(
        ["predict", *argv, "--data", str(U.image_folder(tmp_path, 1)), "--output-dir", str(tmp_path / "o"), *flags]
    )
    (line,) = _errors(capsys)
    assert code == 2 and error in line


def test_a_batch_of_images_reads_as_its_items_one_by_one(tmp_path):
    """``ImageDataset.__getitems__`` (one column read, one image-processor call) equals ``dataset[i]``."""
    from sopfast.adapters.sources import load_backbone
    from sopfast.data.splits import DataOptions, load_split

    backbone = load_backbone(str(U.vit_dir(tmp_path)))
    model = sopfast.SOP(backbone, num_groups=2)
    dataset = load_split(
        str(U.image_folder(tmp_path, 2)), "test", model.adapter, backbone, DataOptions(holdout=None)
    ).dataset
    assert dataset.preprocess_many is not None and len(dataset) == 6
    batch = dataset.__getitems__([4, 0, 3])
    for (x, y), i in zip(batch, [4, 0, 3]):
        assert torch.equal(x, dataset[i][0]) and int(y) == int(dataset[i][1])


@pytest.mark.parametrize("layout", ["flat", "splits", "a split keyword in a name"])
def test_image_folders_open_as_datasets_infers_them(tmp_path, layout):
    """One walk of the tree finds the splits ``datasets`` would (its inference walks it ~70 times)."""
    import datasets

    from sopfast.data import user_data as D

    folder = U.image_folder(tmp_path, 2, splits=layout == "splits")
    if layout == "a split keyword in a name":  # left to datasets' inference (here: one split)
        (folder / "owl").rename(folder / "devices")
    with D._quiet_datasets():
        plain = D._plain_splits(datasets, str(folder))
        opened = D.open_source(str(folder)).splits
        inferred = datasets.load_dataset("imagefolder", data_dir=str(folder))
    assert (plain is None) == (layout == "a split keyword in a name")
    assert list(opened) == list(inferred) == (["train", "test"] if layout == "splits" else ["train"])
    for name, split in inferred.items():
        assert opened[name]["label"] == split["label"] and opened[name].features["label"] == split.features["label"]
        assert [i["path"] for i in opened[name]["image"]] == [i.filename for i in split["image"]]
