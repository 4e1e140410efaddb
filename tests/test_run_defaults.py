"""Issue #32: what a run does without being told — one default mode for Python and the command line, a
default run folder, the version, help texts that say what each flag does, and which data is used."""

from __future__ import annotations

import json
import re

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
