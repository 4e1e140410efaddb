"""Your own data and models on the command line: docs/data.md's "Your own data" commands, run on tiny
files the tests write (image folder + HF ViT, saved dataset + BERT, CSV + timm ViT with local
weights, CNNs), and the data layer underneath (splits, columns, labels, preprocessing)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

import sopfast
import user_data as U
from sopfast.adapters import preprocessing as P
from sopfast.cli.app import main
from sopfast.data import user_data as D
from sopfast.testing import TinyCNN, make_bert, make_hf_vit

README = Path(__file__).resolve().parents[1] / "docs" / "data.md"
FAST = ["--epochs", "1", "--batch-size", "4", "--num-groups", "4", "--lr", "1e-3", "--no-progress"]


def readme_commands() -> list[list[str]]:
    """The ``sopfast`` command lines of the README's "Your own data" code block."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Your own data") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("sopfast ")]


def _command(argv: list[str], names: dict[str, str]) -> list[str]:
    """``argv`` with the README's placeholder paths replaced by the test's files."""
    out = []
    for token in argv:
        head, sep, tail = token.partition("/")
        out.append(names[head] + sep + tail if head in names else names.get(token, token))
    return out


def _run(argv: list[str], capsys, stream: str = "out") -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return getattr(captured, stream)


def _train(argv: list[str], capsys) -> str:
    """Run a README ``train`` line quickly (flags given last win); returns its stderr report."""
    return _run([*argv, *FAST], capsys, "err")


def _evaluate_and_explain(train_argv: list[str], tmp_path: Path, capsys) -> tuple[dict, list[str]]:
    """``evaluate`` (JSON results) and ``explain`` of a ``train`` line's run folder, with no flag of the
    training repeated: the model brings its backbone, data, columns and preprocessing (issue #32)."""
    flags = train_argv[1:]
    common = ["--checkpoint", flags[flags.index("--output-dir") + 1]]
    results_path = tmp_path / "results" / "res.json"
    _run(
        ["evaluate", *common, "--metrics", "accuracy", "fidelity", "--no-progress", "--output", str(results_path)],
        capsys,
    )
    out = _run(["explain", *common, "--count", "2", "--out", str(tmp_path / "pics")], capsys)
    return json.loads(results_path.read_text()), out.split()


def test_readme_lists_one_command_per_data_kind():
    kinds = [" ".join(c) for c in readme_commands() if c[0] == "train"]
    assert len(kinds) == 5
    assert any("my-images" in k and "my-vit" in k for k in kinds)
    assert any("my-saved-dataset" in k for k in kinds) and any(".csv" in k and "my-bert" in k for k in kinds)
    assert any("timm:" in k and "--backbone-weights" in k for k in kinds)
    assert any("--feature-layer" in k for k in kinds)


def test_image_folder_with_hf_vit_train_evaluate_explain(tmp_path, capsys):
    names = {
        "my-vit": str(U.vit_dir(tmp_path)),
        "my-images": str(U.image_folder(tmp_path, splits=True)),
        "run": str(tmp_path / "run"),
        "pics": str(tmp_path / "pics"),
    }
    train, evaluate, explain = [_command(c, names) for c in readme_commands()[:3]]
    assert evaluate[:3] == ["evaluate", "--checkpoint", names["run"]] and "--data" not in evaluate + explain
    out = _train(train, capsys)
    # issue #32: validation is held out of the training split, never taken from the test split
    assert "split train, training part (9 of 12: the validation part held out, stratified, seed 0), 9 ex" in out
    assert "val data" in out and "split train, validation part held out of it (3 of 12, stratified" in out
    assert "split test" not in out
    shown = _run([*evaluate, "--no-progress", "--output", str(tmp_path / "r.json")], capsys)
    assert shown.startswith(f"test data: {names['my-images']}, split test, 12 examples")  # which split
    results = json.loads((tmp_path / "r.json").read_text())["SOP"]
    assert results["examples"] == 12 and results["fidelity"] == pytest.approx(0, abs=1e-6)
    assert results["data"].startswith("test data:")
    assert {"insertion", "deletion", "accuracy"} <= set(results)
    paths = _run(explain, capsys).split()
    assert len(paths) == 8 and all(Path(p).is_file() and p.endswith(".png") for p in paths)


def test_saved_text_dataset_with_bert_train_evaluate_explain(tmp_path, capsys):
    names = {
        "my-bert": str(U.bert_dir(tmp_path)),
        "my-saved-dataset": str(U.saved_text_dataset(tmp_path)),
        "run-text": str(tmp_path / "run-text"),
    }
    train = _command(next(c for c in readme_commands() if "my-saved-dataset" in c), names)
    out = _train(train, capsys)
    assert "train data" in out and "split train, training part (10 of 12: the validation part held out" in out
    assert "split test" not in out
    results, paths = _evaluate_and_explain(train, tmp_path, capsys)
    assert results["SOP"]["examples"] == 6 and results["SOP"]["fidelity"] == pytest.approx(0, abs=1e-6)
    assert len(paths) == 2 and all(p.endswith(".html") for p in paths)
    page = Path(paths[0]).read_text()
    assert "Prediction: neg" in page or "Prediction: pos" in page  # ClassLabel names reach the pictures


def test_text_csv_with_pairs_and_bert(tmp_path, capsys):
    names = {
        "my-bert": str(U.bert_dir(tmp_path)),
        "reviews.csv": str(U.text_csv(tmp_path, pairs=True)),
        "run-csv": str(tmp_path / "run-csv"),
    }
    train = _command(next(c for c in readme_commands() if "reviews.csv" in c), names)
    out = _train(train, capsys)
    assert "training part (8 of 12: the test and validation parts held out, stratified, seed 0), 8 examples" in out
    assert "validation part held out of it (2 of the 10 left after the test part, stratified, seed 0)" in out
    model = sopfast.SOP.from_pretrained(
        str(tmp_path / "run-csv" / "last"), sopfast.adapters.load_backbone(names["my-bert"]).model
    )
    assert model.num_classes == 2


def test_csv_of_images_with_timm_vit_and_local_weights(tmp_path, capsys):
    names = {
        "timm:vit_small_patch16_224": "timm:test_vit",
        "vit.safetensors": str(U.timm_weights(tmp_path)),
        "images.csv": str(U.image_csv(tmp_path)),
        "run-timm": str(tmp_path / "run-timm"),
    }
    train = _command(next(c for c in readme_commands() if "images.csv" in c), names)
    assert "timm:test_vit" in train
    _train(train, capsys)
    results, paths = _evaluate_and_explain(train, tmp_path, capsys)
    assert results["SOP"]["examples"] == 3 and results["Backbone"]["examples"] == 3  # one per class held out
    assert [Path(p).name[:11] for p in paths] == ["image_0000_", "image_0001_"]
    assert all(Path(p).is_file() for p in paths)


def test_cnn_from_torchvision_weights_with_feature_layer(tmp_path, capsys):
    import torchvision

    weights = tmp_path / "resnet18.pth"
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), weights)
    names = {
        "resnet18.pth": str(weights),
        "my-images": str(U.image_folder(tmp_path, per_class=2)),
        "run-cnn": str(tmp_path / "run-cnn"),
    }
    train = _command(next(c for c in readme_commands() if "--feature-layer" in c), names)
    out = _train([*train, "--image-size", "32"], capsys)
    assert "training part (2 of 6: the test and validation parts held out" in out
    saved = json.loads((tmp_path / "run-cnn" / "last" / "sop_config.json").read_text())
    assert saved["config"]["feature_layer"] == "layer3" and saved["config"]["mode"] == "exact"
    evaluate = ["evaluate", "--checkpoint", names["run-cnn"], "--metrics", "accuracy", "--no-progress"]
    err = _run(evaluate, capsys, "err")  # issue #32: the size it trained at, not the 224 of a bare CNN
    assert "32x32 pixels" in err and "as the model was trained: size [32, 32]" in err, err


def test_pickled_module_needs_trust_and_torchscript_is_refused(tmp_path, capsys):
    model_file = tmp_path / "cnn.pt"
    torch.save(TinyCNN(), model_file)
    data = str(U.image_folder(tmp_path, per_class=2, size=16))
    argv = [
        "train",
        "--backbone",
        str(model_file),
        "--data",
        data,
        "--feature-layer",
        "features",
        "--image-size",
        "16",
        "--output-dir",
        str(tmp_path / "run"),
        *FAST,
    ]
    assert main(argv) == 2
    assert "--trust-pickle" in capsys.readouterr().err
    _run([*argv, "--trust-pickle"], capsys)
    scripted = tmp_path / "cnn.ts"
    torch.jit.save(torch.jit.script(TinyCNN()), str(scripted))
    assert main(["train", "--backbone", str(scripted), "--data", data, "--trust-pickle"]) == 2
    assert "TorchScript" in capsys.readouterr().err


# -- the data layer ---------------------------------------------------------------------------------
def _vit_prep(tmp_path, **kwargs) -> P.Preprocessing:
    source = sopfast.adapters.load_backbone(str(U.vit_dir(tmp_path)))
    return P.preprocessing_for(sopfast.SOP(source.model, num_groups=2).adapter, source, **kwargs)


def test_preprocessing_follows_the_hf_processor_config(tmp_path):
    from PIL import Image

    prep = _vit_prep(tmp_path)
    assert prep.size == (32, 32) and prep.mean == (0.5, 0.5, 0.5) and prep.label2id == {"cat": 0, "dog": 1, "owl": 2}
    image = Image.fromarray(np.full((50, 70, 3), 255, dtype=np.uint8))
    x = prep.image(image)
    assert x.shape == (3, 32, 32) and torch.allclose(x, torch.ones_like(x))
    with pytest.raises(P.PreprocessingError, match="differs from the backbone's input size"):
        _vit_prep(tmp_path, image_size=[64])
    with pytest.raises(P.PreprocessingError, match="1 or 3 values"):
        _vit_prep(tmp_path, mean=[0.1, 0.2])


def test_preprocessing_from_timm_pretrained_cfg_crops_the_centre():
    import timm
    from PIL import Image

    backbone = timm.create_model("test_vit", pretrained=False, num_classes=3, img_size=32, dynamic_img_size=False)
    source = sopfast.adapters.Backbone(backbone, "timm", "timm:test_vit")
    prep = P.preprocessing_for(sopfast.SOP(backbone, num_groups=2).adapter, source)
    assert prep.size == (32, 32) and prep.resize_to == 33 and prep.resample == "bicubic"
    assert prep.image(Image.new("RGB", (40, 60))).shape == (3, 32, 32)


def test_single_split_is_cut_into_test_validation_and_training_parts_alike_every_run(tmp_path):
    prep = _vit_prep(tmp_path)
    folder = str(U.image_folder(tmp_path, per_class=4))
    train, name = D.load_split(folder, "train", prep, holdout=0.25)
    test, test_name = D.load_split(folder, "test", prep, holdout=0.25)
    val, val_name = D.load_split(folder, "val", prep, holdout=0.25)
    again, _ = D.load_split(folder, "val", prep, holdout=0.25)
    assert (len(train), len(val), len(test)) == (6, 3, 3)
    assert name == "train, training part (6 of 12: the test and validation parts held out, stratified, seed 0)"
    assert test_name == "train, held-out test part (3 of 12, stratified, seed 0)"
    assert val_name == "train, validation part held out of it (3 of the 9 left after the test part, stratified, seed 0)"
    for part in (test, val):
        assert sorted(int(part[i][1]) for i in range(3)) == [0, 1, 2]  # one per class
    paths = lambda dataset: [source["path"] for source in dataset.sources]  # undecoded datasets.Image
    assert set(paths(train)).isdisjoint(paths(test)) and set(paths(val)).isdisjoint(paths(test))
    assert set(paths(train)).isdisjoint(paths(val)) and paths(val) == paths(again)
    x, y = train[0]
    assert x.shape == (3, 32, 32) and y.dtype == torch.long and train.classes == list(U.CLASSES)


def test_validation_is_held_out_of_train_when_the_data_has_train_and_test(tmp_path):
    """Issue #32: ``imgs/{train,test}`` once validated (and chose ``best/``) on the test split."""
    prep = _vit_prep(tmp_path)
    folder = str(U.image_folder(tmp_path, per_class=4, splits=True))
    train, _ = D.load_split(folder, "train", prep, holdout=0.25)
    val, name = D.load_split(folder, "val", prep, holdout=0.25)
    test, test_name = D.load_split(folder, "test", prep)
    paths = lambda dataset: {source["path"] for source in dataset.sources}
    assert test_name == "test" and paths(val).isdisjoint(paths(test)) and paths(val).isdisjoint(paths(train))
    assert name.startswith("train, validation part held out of it (3 of 12")
    assert all("/train/" in p for p in paths(val)) and (len(train), len(val)) == (9, 3)


def test_limit_and_count_take_every_class_in_turn(tmp_path):
    """Issue #32: ``--limit 3`` of a folder sorted by class once took three cats."""
    from sopfast.data.sampling import across_classes, stratified_holdout

    prep = _vit_prep(tmp_path)
    folder = str(U.image_folder(tmp_path, per_class=4))
    three, _ = D.load_split(folder, "test", prep, split="train", limit=3)
    assert sorted(int(three[i][1]) for i in range(3)) == [0, 1, 2]
    again, _ = D.load_split(folder, "test", prep, split="train", limit=3)
    assert [s["path"] for s in three.sources] == [s["path"] for s in again.sources]  # the same every run
    labels = ["a"] * 6 + ["b"] * 2 + ["c"] * 1
    picked = across_classes(labels, 5, seed=0)
    assert sorted(labels[i] for i in picked) == ["a", "a", "b", "b", "c"] and len(set(picked)) == 5
    assert across_classes(labels, 5, seed=1) != picked and across_classes(labels, 20) == list(range(9))
    rest, held = stratified_holdout(labels, 0.5, seed=0)
    assert sorted(rest + held) == list(range(9)) and sorted(labels[i] for i in held) == ["a", "a", "a", "b"]


def test_labels_by_name_follow_the_backbone_label2id(tmp_path):
    prep = _vit_prep(tmp_path)
    prep.label2id = {"owl": 0, "dog": 1, "cat": 2}
    dataset, _ = D.load_split(str(U.image_csv(tmp_path, jsonl=True)), "train", prep, holdout=0.5)
    labels = {dataset.labels[i]: int(dataset[i][1]) for i in range(len(dataset))}
    assert all(prep.label2id[name] == y for name, y in labels.items())
    assert dataset.classes == ["owl", "dog", "cat"]


def test_named_splits_and_their_errors(tmp_path):
    bert = sopfast.SOP(sopfast.adapters.load_backbone(str(U.bert_dir(tmp_path))).model, num_groups=2)
    prep = P.preprocessing_for(
        bert.adapter, sopfast.adapters.Backbone(bert.backbone, "hf", "b", str(tmp_path / "bert"))
    )
    saved = str(U.saved_text_dataset(tmp_path, column="text"))
    train, name = D.load_split(saved, "val", prep, split="train")
    assert name == "train" and len(train) == 12 and set(train[0]) >= {"input_ids", "attention_mask", "labels"}
    with pytest.raises(D.DataError, match=r"no split 'dev'; available: \['train', 'test'\]"):
        D.load_split(saved, "val", prep, split="dev")
    with pytest.raises(D.DataError, match="no text column 'body'"):
        D.load_split(saved, "train", prep, columns=D.Columns(text="body"))
    with pytest.raises(D.DataError, match="no label column"):
        D.load_split(saved, "train", prep, columns=D.Columns(label="stars"))


def test_label_ids_outside_the_backbone_classes_are_refused(tmp_path):
    prep = _vit_prep(tmp_path)
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps({"image": [[0, 0], [0, 0]], "label": y}) + "\n" for y in (0, 1, 5)))
    with pytest.raises(D.DataError, match=r"class ids \[5\] are outside the backbone's 3 classes"):
        D.load_split(str(table), "train", prep)


def test_image_sources_of_every_form():
    from PIL import Image

    array = np.zeros((4, 5, 3), dtype=np.uint8)
    assert D.load_image(array).size == (5, 4)
    assert D.load_image(array.transpose(2, 0, 1).astype(np.float32)).size == (5, 4)
    assert D.load_image(Image.new("L", (3, 3))).mode == "L"
    with pytest.raises(D.DataError, match="cannot read the image"):
        D.load_image("missing.png", "/nonexistent")


def test_builtin_data_of_the_wrong_modality_is_an_error(tmp_path, capsys):
    assert main(["train", "--backbone", str(U.bert_dir(tmp_path)), "--data", "digits"]) == 2
    assert "--data digits is image data but the backbone is a text model" in capsys.readouterr().err
    vit = make_hf_vit()
    vit.save_pretrained(tmp_path / "v")
    assert main(["train", "--backbone", str(tmp_path / "v"), "--data", "tweets"]) == 2
    assert "--data tweets is text data but the backbone is an image model" in capsys.readouterr().err


def test_text_preprocessing_needs_a_tokenizer(tmp_path):
    bert = make_bert()
    bert.save_pretrained(tmp_path / "b")
    with pytest.raises(P.PreprocessingError, match="no tokenizer in the backbone directory"):
        P.preprocessing_for(
            sopfast.SOP(bert, num_groups=2).adapter, sopfast.adapters.Backbone(bert, "hf", "b", str(tmp_path / "b"))
        )


def test_train_with_a_seed_is_reproducible(tmp_path, capsys):
    """Two identical ``sopfast train --seed 0`` runs end with identical weights (the model is built after seeding)."""
    from safetensors.torch import load_file

    names = {"my-vit": str(U.vit_dir(tmp_path)), "my-images": str(U.image_folder(tmp_path, splits=True))}
    train = _command(readme_commands()[0], names)
    weights = []
    for run in ("a", "b"):
        flags = [*train, "--output-dir", str(tmp_path / run), "--seed", "0"]
        _train(flags, capsys)
        weights.append(load_file(tmp_path / run / "last" / "sop_model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
