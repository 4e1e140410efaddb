"""Messages go through ``logging`` (the ``sopfast`` logger): --quiet / --verbose, and the warnings
for data that does not fit (a tokenizer that maps most words to [UNK], constant images)."""

from __future__ import annotations

import csv
import logging

import numpy as np

import user_data as U
from sopfast.cli.app import main

FAST = ["--epochs", "1", "--batch-size", "4", "--num-groups", "2", "--no-progress", "--max-steps", "1"]


def _train(argv: list[str], capsys) -> str:
    code = main(["train", *argv, *FAST])
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def test_quiet_hides_progress_messages_and_verbose_adds_details(tmp_path, capsys):
    vit, images = U.vit_dir(tmp_path), U.image_folder(tmp_path)
    argv = ["--backbone", str(vit), "--data", str(images), "--output-dir", str(tmp_path / "run")]
    default = _train([*argv, "--no-resume"], capsys)
    assert "sopfast: train data:" in default and "columns" not in default
    assert _train([*argv, "--no-resume", "--quiet"], capsys).count("sopfast: ") == default.count("sopfast: warning")
    verbose = _train([*argv, "--no-resume", "--verbose"], capsys)
    assert "image-folder source, splits ['train']; columns" in verbose
    assert logging.getLogger("sopfast").level == logging.DEBUG


def test_a_tokenizer_that_does_not_fit_the_texts_is_reported(tmp_path, capsys):
    bert = U.bert_dir(tmp_path)
    path = tmp_path / "foreign.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i in range(12):
            writer.writerow([f"zorgle blimf quaxo wibbit {i} snerk", i % 2])
    err = _train(["--backbone", str(bert), "--data", str(path), "--output-dir", str(tmp_path / "run")], capsys)
    assert "of the tokens are the unknown token '[UNK]': the tokenizer (BertTokenizer) does not fit" in err
    fitting = _train(
        ["--backbone", str(bert), "--data", str(U.text_csv(tmp_path)), "--output-dir", str(tmp_path / "r2")], capsys
    )
    assert "unknown token" not in fitting


def test_constant_images_are_reported(tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "flat"
    for c in U.CLASSES:
        (folder / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((32, 32, 3), 128, dtype=np.uint8)).save(folder / c / f"{i}.png")
    err = _train(
        ["--backbone", str(U.vit_dir(tmp_path)), "--data", str(folder), "--output-dir", str(tmp_path / "run")], capsys
    )
    assert "the first images are one constant colour after preprocessing" in err
