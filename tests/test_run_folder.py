"""Issue #22: a run folder that explains and reproduces itself (config, TensorBoard, CSV, curves,
backbone and preprocessing recorded), one-argument loading, longer schedules continuing, and timm
backbones built with constructor arguments on the command line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

import sopfast
import user_data as U
from sopfast.cli.app import main
from sopfast.model.checkpoint import trainable_state_dict
from sopfast.training.records import PENALTIES

pytest.importorskip("tensorboard")
TRAIN = ["--batch-size", "4", "--num-groups", "4", "--lr", "1e-3", "--no-progress", "--eval-every", "2"]


def _ok(argv: list[str], capsys) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return trainable_state_dict(sopfast.SOP.from_pretrained(directory))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One CLI training run of a tiny HF ViT on a tiny image folder (one epoch of 3 steps)."""
    root = tmp_path_factory.mktemp("run")
    vit, images = U.vit_dir(root), U.image_folder(root, per_class=5)
    out = root / "run"
    argv = ["train", "--backbone", str(vit), "--data", str(images), "--output-dir", str(out), "--epochs", "1"]
    assert main([*argv, *TRAIN, "--log-every", "1"]) == 0
    return {"root": root, "vit": vit, "images": images, "out": out}


def test_the_run_folder_holds_config_events_csv_and_curves(run):
    out = run["out"]
    assert {"best", "last", "log.jsonl", "metrics.csv", "training_curves.png", "config.yaml", "tensorboard"} <= {
        p.name for p in out.iterdir()
    }
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    events = [(r["event"], int(r["step"])) for r in rows]
    train_steps = [s for e, s in events if e == "train"]
    assert train_steps == list(range(1, len(train_steps) + 1)) and len(train_steps) >= 3  # every step
    for event, step in events:
        if event == "eval":  # after the train record of its own step
            assert events.index(("train", step)) < events.index(("eval", step))
    assert all(float(r["loss"]) >= 0 for r in rows if r["event"] == "train")
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["backbone"] == str(run["vit"]) and config["data"] == str(run["images"])
    assert config["num_groups"] == 4 and config["epochs"] == 1
    assert "output_dir" not in config  # `--config` runs it again in a new run folder, never resumes this one
    png = (out / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_each_loss_term_is_logged_apart_and_validation_compares_like_with_like(run):
    """Issue #32: the training loss (cross-entropy + penalties) is not drawn beside the validation
    cross-entropy as one quantity; each term has its column, tag and axis."""
    rows = list(csv.DictReader((run["out"] / "metrics.csv").open()))
    train = [r for r in rows if r["event"] == "train"]
    for r in train:  # the default recipe on images: the overlap and sufficiency terms, no saliency teacher
        given = [name for name in PENALTIES if r[name] != ""]
        assert given == ["diversity_penalty", "sufficiency_penalty"]
        terms = float(r["task_loss"]) + sum(float(r[name]) for name in given)
        assert float(r["loss"]) == pytest.approx(terms, rel=1e-5)
        assert float(r["diversity_penalty"]) > 0 and float(r["sufficiency_penalty"]) != 0
    assert all(r["val_loss"] for r in rows if r["event"] == "eval")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run["out"] / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/task_loss", "train/diversity_penalty", "train/sufficiency_penalty"} <= scalars
    assert {"eval/val_loss", "eval/val_accuracy"} <= scalars
    assert any("config.yaml" in tag for tag in events.Tags()["tensors"])  # the resolved config, as text
    hparams = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams and b"saliency_weight" in hparams["_hparams_/experiment"]
    import matplotlib.pyplot as plt

    from sopfast.training.records import plot_training_curves

    seen = []
    original = plt.subplots
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plt, "subplots", lambda *a, **k: seen.append(a) or original(*a, **k))
        records = [json.loads(line) for line in (run["out"] / "log.jsonl").read_text().splitlines()]
        plot_training_curves(records, run["out"] / "curves_again.png")
    rows_, columns = seen[0]
    assert rows_ * columns >= 7  # task loss, training loss, 2 penalties, accuracy, gradient norm, lr


def test_best_records_its_backbone_and_preprocessing_and_loads_with_one_argument(run):
    saved = json.loads((run["out"] / "best" / "sop_config.json").read_text())
    provenance = saved["provenance"]
    assert provenance["backbone"] == {"kind": "hf", "spec": str(run["vit"]), "options": {}, "weights": None}
    assert provenance["preprocessing"]["size"] == [32, 32] and provenance["preprocessing"]["mean"] == [0.5] * 3
    assert provenance["preprocessing"]["library"] == "transformers ViTImageProcessor"  # the directory's own
    model = sopfast.SOP.from_pretrained(run["out"] / "best")
    assert model.num_groups == 4
    from_folder = sopfast.SOP.from_pretrained(run["out"])  # a run folder: its best/
    assert all(
        torch.equal(a, b)
        for a, b in zip(_weights(run["out"] / "best").values(), trainable_state_dict(from_folder).values())
    )


def test_evaluate_and_explain_a_run_folder_without_the_backbone(run, capsys, tmp_path):
    results = tmp_path / "results.json"
    argv = ["evaluate", "--checkpoint", str(run["out"]), "--data", str(run["images"]), "--metrics", "accuracy"]
    _ok([*argv, "--output", str(results), "--no-progress"], capsys)
    assert json.loads(results.read_text())["SOP"]["examples"] == 3  # the held-out part: 10 % of 15 but one per class
    pictures = tmp_path / "pictures"
    _ok(
        [
            "explain",
            "--checkpoint",
            str(run["out"]),
            "--data",
            str(run["images"]),
            "--count",
            "1",
            "--out",
            str(pictures),
        ],
        capsys,
    )
    assert len(list(pictures.glob("*.png"))) == 1


def test_the_saved_config_reproduces_the_weights(run, capsys, tmp_path):
    again = tmp_path / "again"
    _ok(["train", "--config", str(run["out"] / "config.yaml"), "--output-dir", str(again)], capsys)
    first, second = _weights(run["out"] / "last"), _weights(again / "last")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_longer_schedule_continues_and_other_changes_are_refused(run, capsys, tmp_path):
    import shutil

    folder = tmp_path / "continued"
    shutil.copytree(run["out"], folder)
    argv = ["train", "--config", str(run["out"] / "config.yaml"), "--output-dir", str(folder)]
    code = main([*argv, "--epochs", "2"])
    assert code == 0 and "resuming from step 3 of 6" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (folder / "log.jsonl").read_text().splitlines()]
    assert max(steps) == 2 * max(json.loads(x)["step"] for x in (run["out"] / "log.jsonl").read_text().splitlines())
    assert main([*argv, "--epochs", "2", "--batch-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "batch_size" in err and "--no-resume" in err


def test_timm_backbone_with_constructor_arguments_on_the_command_line(tmp_path, capsys):
    import timm
    from safetensors.torch import save_file

    options = {"img_size": 48, "patch_size": 8, "depth": 2}
    backbone = timm.create_model("test_vit", pretrained=False, num_classes=3, dynamic_img_size=False, **options)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in backbone.state_dict().items()}, weights)
    flags = [f"--backbone-option={k}={v}" for k, v in options.items()]
    out = tmp_path / "run"
    argv = ["train", "--backbone", "timm:test_vit", "--backbone-weights", str(weights), *flags]
    _ok(
        [*argv, "--data", str(U.image_folder(tmp_path, size=60)), "--output-dir", str(out), "--max-steps", "1", *TRAIN],
        capsys,
    )
    model = sopfast.SOP.from_pretrained(out / "last")  # rebuilt with the same arguments, from the record
    assert model.adapter.image_size == (48, 48) and len(model.backbone.blocks) == 2
    assert model.adapter.grid == (6, 6)  # 48 px in patches of 8
    saved = json.loads((out / "last" / "sop_config.json").read_text())
    assert saved["provenance"]["preprocessing"]["size"] == [48, 48]
