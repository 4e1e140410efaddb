"""Issue #32: what a run does without being told — one default mode for Python and the command line, a
default run folder, the version, help texts that say what each flag does, and which data is used."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import sopfast
import user_data as U
from sopfast.cli.app import build_parser, main
from sopfast.testing import TinyCNN, make_bert, make_hf_vit

TRAIN = ["--batch-size", "4", "--num-groups", "4", "--lr", "1e-3", "--no-progress", "--no-diagnose"]


def test_one_default_mode_for_python_and_the_command_line(tmp_path, capsys):
    assert sopfast.SOP(make_hf_vit(), num_groups=3).mode == "drop"  # the recipe's: drop where supported
    assert sopfast.SOP(make_bert(), num_groups=3).mode == "drop"
    assert sopfast.SOP(make_hf_vit(), num_groups=3, recipe="paper").mode == "exact"  # the authors' algorithm
    assert sopfast.SOP(TinyCNN(), num_groups=3, feature_layer="features").mode == "exact"  # no drop for CNNs
    assert sopfast.SOP(make_hf_vit(), num_groups=3, mode="exact").config["mode"] == "exact"
    out = tmp_path / "run"
    argv = ["train", "--backbone", str(U.vit_dir(tmp_path)), "--data", str(U.image_folder(tmp_path))]
    assert main([*argv, "--output-dir", str(out), "--max-steps", "1", *TRAIN]) == 0
    assert json.loads((out / "last" / "sop_config.json").read_text())["config"]["mode"] == "drop"
    help_text = " ".join(build_parser().subcommands["train"].format_help().split())
    assert "the recipe's: drop where the backbone supports it for sopfast, exact for paper" in help_text


def test_every_flag_of_a_command_says_something_of_its_own():
    """``--weight-decay`` and ``--blur-sigma`` once repeated ``--lr`` and ``--blur-kernel-size``'s help."""
    for name, sub in build_parser().subcommands.items():
        seen: dict[str, str] = {}
        for action in sub._actions:
            if action.help and action.option_strings:
                text = re.sub(r"\s*\(default: [^)]*\)$", "", action.help)
                assert text not in seen, (name, action.option_strings[0], seen.get(text))
                seen[text] = action.option_strings[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"sopfast {sopfast.__version__}"


def test_explain_has_the_progress_switch_of_evaluate_and_train():
    for command in ("train", "evaluate", "explain"):
        dests = {a.dest for a in build_parser().subcommands[command]._actions}
        assert "progress" in dests, command


def test_train_without_output_dir_writes_a_run_folder_and_says_where(tmp_path, capsys, monkeypatch):
    vit, images = U.vit_dir(tmp_path), U.image_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--backbone", str(vit), "--data", str(images), "--max-steps", "1", *TRAIN]
    assert main(argv) == 0
    captured = capsys.readouterr()
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and re.fullmatch(r"\d{8}-\d{6}-vit-images", runs[0].name)
    assert f"the run folder is {Path('runs') / runs[0].name}" in captured.err
    assert f"model saved to {Path('runs') / runs[0].name / 'last'}" in captured.out
    assert (runs[0] / "last" / "sop_config.json").is_file()
    # its config.yaml runs the training again from any folder, into a new run folder, not resuming this one
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["train", "--config", str(runs[0] / "config.yaml")]) == 0
    err = capsys.readouterr().err
    assert "resuming" not in err and len(list((elsewhere / "runs").iterdir())) == 1


def test_a_bare_backbone_says_it_uses_fashion_mnist(tmp_path, capsys):
    argv = ["train", "--backbone", str(U.vit_dir(tmp_path)), "--output-dir", str(tmp_path / "run"), *TRAIN]
    main([*argv, "--limit", "8", "--val-limit", "4", "--max-steps", "1"])  # 28x28 grey images may not fit
    assert "no --data given: using the built-in fashion-mnist" in capsys.readouterr().err


def test_builtin_data_validates_on_a_part_of_its_training_split():
    """Issue #32: ``--data digits`` once validated on its test split."""
    from sopfast.data.builtin import BUILTIN

    read = BUILTIN["digits"].read
    (train, _), (val, val_part), (test, _) = (read(r, None, None, None, 0.1) for r in ROLES)
    assert (len(train), len(val), len(test)) == (1350, 150, 297)
    assert val_part.startswith("validation part held out of the train split (150 of 1500, stratified")
    rows = lambda dataset: {tuple(dataset[i][0].flatten().tolist()) for i in range(len(dataset))}
    assert rows(val).isdisjoint(rows(test)) and rows(val).isdisjoint(rows(train))
    few, text = read("train", 20, None, None, 0.1)
    assert len(few) == 20 and len({int(few[i][1]) for i in range(20)}) == 10 and "20 of them across classes" in text


ROLES = ("train", "val", "test")


def test_another_backbone_names_the_flag_that_loads_anyway(tmp_path):
    model = sopfast.SOP(make_hf_vit(), num_groups=3)
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match=r"strict_backbone=False \(--no-strict-backbone\) to load anyway"):
        sopfast.SOP.from_pretrained(tmp_path / "m", make_hf_vit(seed=1))
