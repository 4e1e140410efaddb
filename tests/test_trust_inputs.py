"""Nothing silently wrong in what `diagnose` and the label maps take (issues #42, #43): a backbone with a
NaN weight, labels outside the classes, a duplicate or boolean label map, ids mixed with names, an empty
folder, a built-in name shadowed by a folder — each is a clear error naming the argument and the value,
or a correct result; a model trained with a label map carries it to every later command, and a run's
config.yaml reads back with every flag."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import sopfast
import user_data as U
from sopfast.adapters.preprocessing import Preprocessing
from sopfast.cli.app import build_parser, main
from sopfast.cli.common import label_map, load_backbone, load_model
from sopfast.cli.parser import CLIError, config_tokens
from sopfast.data import user_data as D
from sopfast.data.builtin import FASHION_MNIST_CLASSES
from sopfast.data.labels import DataError, label_ids
from sopfast.testing import make_hf_vit

NAMED = Preprocessing("image", label2id={"cat": 0, "dog": 1, "owl": 2}, num_classes=3)
UNNAMED = Preprocessing("image", num_classes=3)
FASHION = Preprocessing("image", label2id={c: i for i, c in enumerate(FASHION_MNIST_CLASSES)}, num_classes=10)
X = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return make_hf_vit(num_labels=3).eval()


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory) -> str:
    return str(U.vit_dir(tmp_path_factory.mktemp("vit")))


def ids(labels, prep, label_map=None) -> list[int]:
    to_id, _ = label_ids(labels, prep, None, "data.csv", label_map)
    return [to_id(v) for v in labels]


def _diagnose(backbone, labels=None, x=X, **options) -> sopfast.Diagnosis:
    batch = (x,) if labels is None else (x, torch.as_tensor(labels))
    return sopfast.diagnose(backbone, [batch], progress=False, informed_examples=0, **options)


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- diagnose -----------------------------------------------------------------------------------------
def test_diagnose_refuses_a_backbone_whose_outputs_are_not_finite(vit):
    broken = copy.deepcopy(vit)
    with torch.no_grad():
        broken.classifier.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"not finite: its parameter 'classifier.weight' holds NaN"):
        _diagnose(broken, [0, 1, 2, 0, 1, 2, 0, 1])
    x = X.clone()
    x[1, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"images contains NaN or Inf values"):  # the adapter's check
        _diagnose(vit, [0] * 8, x=x)


@pytest.mark.parametrize(
    "labels, error, match",
    [
        ([7] * 8, ValueError, r"labels must lie in \[0, 2\] \(the 3 classes of the backbone\), got \[7\]"),
        ([0, -1] * 4, ValueError, r"labels must lie in \[0, 2\] .*got \[-1\]"),
        ([0.5] * 8, TypeError, r"labels must be integer class ids in \[0, 2\] .*values \[0.5\]"),
    ],
)
def test_diagnose_refuses_labels_that_are_not_classes_of_the_backbone(vit, labels, error, match):
    with pytest.raises(error, match=match):
        _diagnose(vit, labels)


def test_diagnose_chance_is_the_most_common_class_share(vit):
    x = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    report = _diagnose(vit, [0] * 7 + [1] * 3, x=x)
    assert report.chance == pytest.approx(0.7)
    assert "chance 0.700: the most common class's share" in str(report)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_diagnose_on_a_device_this_machine_lacks_names_it(vit):
    with pytest.raises(ValueError, match=r"device 'cuda': CUDA is not available on this machine"):
        _diagnose(vit, [0] * 8, device="cuda")


@pytest.mark.parametrize("form", ["tuples", "dicts"])
def test_train_on_a_list_of_examples_runs_the_default_diagnostic(vit, form):
    """A list is a dataset of examples for ``train`` (with ``batch_size``): its diagnostic reads it alike."""
    items = [(X[i], i % 3) for i in range(8)]
    data = items if form == "tuples" else [{"x": x, "y": y} for x, y in items]
    model = sopfast.SOP(vit, num_groups=2)
    result = sopfast.train(model, data, batch_size=4, max_steps=1, diagnose_examples=8, progress=False)
    assert result.diagnosis is not None and result.diagnosis["examples"] == 8


# -- label maps ---------------------------------------------------------------------------------------
def test_a_label_map_that_names_a_label_twice_is_refused(vit_dir, tmp_path, capsys):
    with pytest.raises(CLIError, match=r"--label-map names 'cat' twice \(cat=0 and cat=1\)"):
        label_map([("cat", 0), ("cat", 1)])
    table = U.image_csv(tmp_path)
    code, _, err = _cli(
        ["diagnose", "--backbone", vit_dir, "--data", str(table), "--label-map", "cat=0", "cat=1"], capsys
    )
    assert code == 2 and "--label-map names 'cat' twice" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("target", [True, 1.5, 1.0, None])
def test_a_label_map_target_must_be_a_class_id_or_name(target):
    with pytest.raises(DataError, match=rf"label_map 'cat' → {target!r} is neither a class id \(an integer\)"):
        ids(["cat", "dog"], NAMED, label_map={"cat": target, "dog": 1})


def test_ids_mixed_with_names_are_refused_when_the_backbone_names_no_classes():
    with pytest.raises(DataError, match=r"labels mix class ids \['2'\] and names \['cat', 'dog'\]"):
        ids(["cat", "dog", "2"], UNNAMED)
    assert ids(["cat", "dog", "bird"], UNNAMED) == [1, 2, 0]  # names alone: sorted, as documented
    assert ids(["0", 2, 1], UNNAMED) == [0, 2, 1]  # ids alone


def test_label_errors_list_every_name_and_suggest_near_matches():
    labels = ["T-shirt_top", *FASHION_MNIST_CLASSES[1:9], "ankle boot", "Bags"]
    with pytest.raises(DataError) as info:
        ids(labels, FASHION)
    text = str(info.value)
    assert "labels ['Bags', 'T-shirt_top', 'ankle boot'] are not classes" in text
    assert all(repr(name) in text for name in FASHION_MNIST_CLASSES)  # the backbone's ten names, none cut
    assert "did you mean: 'Bags' → 'Bag', 'T-shirt_top' → 'T-shirt/top', 'ankle boot' → 'Ankle boot'?" in text
    many = [f"class{i}" for i in range(12)]
    with pytest.raises(DataError, match="'class11'"):
        ids(many, NAMED, label_map={"class0": 0})


def test_a_partial_label_map_completes_the_backbone_names():
    assert ids(["cat", "dog", "Owl"], NAMED, label_map={"Owl": "owl"}) == [0, 1, 2]
    labels = ["T-shirt_top", *FASHION_MNIST_CLASSES[1:]]
    assert ids(labels, FASHION, label_map={"T-shirt_top": "T-shirt/top"}) == list(range(10))
    with pytest.raises(DataError, match=r"does not map the labels \['Kitty'\] nor the backbone's label2id"):
        ids(["Kitty", "dog", "Owl"], NAMED, label_map={"Owl": "owl"})


# -- data folders -------------------------------------------------------------------------------------
def test_an_empty_data_folder_is_one_clear_line(vit_dir, tmp_path, capsys):
    empty = tmp_path / "my-images"
    empty.mkdir()
    with pytest.raises(DataError, match=rf"{empty} is an empty folder"):
        D.load_split(str(empty), "train", NAMED)
    (empty / "notes.txt").write_text("to do")
    code, _, err = _cli(["diagnose", "--backbone", vit_dir, "--data", str(empty)], capsys)
    assert code == 2 and f"{empty} holds no images (found ['notes.txt'])" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_local_folder_wins_over_a_builtin_name_with_a_warning(vit_dir, tmp_path, monkeypatch, capsys):
    U.image_folder(tmp_path, per_class=2).rename(tmp_path / "digits")
    monkeypatch.chdir(tmp_path)
    argv = ["diagnose", "--backbone", vit_dir, "--data", "digits", "--holdout", "0.5", "--examples", "3"]
    code, out, err = _cli([*argv, "--informed-examples", "0", "--num-groups", "2", "--no-progress"], capsys)
    assert code == 0, err
    assert f"reading the local folder {tmp_path / 'digits'}, not the built-in dataset" in err
    assert "backbone diagnostic on 2 examples" in out  # the validation part of the folder


# -- a model trained with a label map -----------------------------------------------------------------
TRAIN_FLAGS = [
    ["--image-column", "image", "--label-column", "label", "--holdout", "0.25", "--limit", "15"],
    ["--val-limit", "4", "--image-size", "32", "--image-mean", "0.5", "0.5", "0.5", "--image-std", "0.5", "0.5", "0.5"],
    ["--num-groups", "2", "--tau", "0.25", "--batch-size", "4", "--max-steps", "1", "--lr", "1e-3", "--seed", "3"],
    ["--no-progress", "--diagnose-examples", "4", "--object-masks", "intensity:0.2", "--device", "cpu"],
    ["--no-find-unused-parameters"],
]


@pytest.fixture(scope="module")
def run_folder(vit_dir, tmp_path_factory) -> tuple[list[str], Path]:
    """A ``sopfast train`` run over labels the backbone does not name (``Owl``, ``Kitty``): mapped with
    ``--label-map``, and many other flags (their values read back from config.yaml)."""
    root = tmp_path_factory.mktemp("labelled")
    table = U.image_csv(root, per_class=6)
    table.write_text(table.read_text().replace(",owl", ",Owl").replace(",cat", ",Kitty"))
    argv = ["train", "--backbone", vit_dir, "--data", str(table), "--output-dir", str(root / "run")]
    argv += ["--label-map", "Owl=owl", "Kitty=0", "dog=1", *(flag for flags in TRAIN_FLAGS for flag in flags)]
    assert main(argv) == 0
    return argv, root / "run"


def test_commands_on_the_checkpoint_use_the_label_map_it_was_trained_with(run_folder, tmp_path, capsys):
    _, run = run_folder
    common = ["--checkpoint", str(run), "--limit", "6", "--device", "cpu"]
    code, _, err = _cli(["evaluate", *common, "--metrics", "accuracy", "--no-progress"], capsys)
    assert code == 0 and '--label-map Kitty=0 Owl="owl" dog=1' in err, err
    code, _, err = _cli(["explain", *common, "--count", "2", "--out", str(tmp_path / "pics")], capsys)
    assert code == 0, err
    code, _, err = _cli(["predict", *common, "--output-dir", str(tmp_path / "predictions"), "--no-progress"], capsys)
    assert code == 0, err


def test_commands_on_the_checkpoint_rank_blank_patches_as_trained_or_as_told(run_folder):
    """``--no-demote-blank`` on a command that loads a model trained with the default recipe ranks blank
    patches like any other at inference (docs/quality.md, "Blank patches and a larger τ")."""
    _, run = run_folder
    for command, required in (("evaluate", []), ("predict", ["--output-dir", "out"]), ("explain", [])):
        parser = build_parser().subcommands[command]
        for flags, demoted in (([], True), (["--no-demote-blank"], False)):
            args = parser.parse_args(["--checkpoint", str(run), "--device", "cpu", *required, *flags])
            assert load_model(args, load_backbone(args)).demote_blank is demoted, (command, flags)


def test_diagnose_takes_the_backbone_and_options_from_the_checkpoint(run_folder, capsys):
    _, run = run_folder
    argv = ["diagnose", "--checkpoint", str(run), "--examples", "3", "--informed-examples", "0", "--no-progress"]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    assert "random groups of tau=0.25" in out and "2 averaged" in out and "verdict:" in out
    code, out, err = _cli([*argv, "--tau", "0.5"], capsys)  # a flag given wins
    assert code == 0 and "random groups of tau=0.5" in out, err
    code, _, err = _cli([*argv, "--feature-layer", "layer3"], capsys)
    assert code == 2 and "--feature-layer: the adapter's options come from --checkpoint" in err, err
    code, _, err = _cli(["diagnose", "--no-progress"], capsys)
    assert code == 2 and "give --backbone (the backbone to measure) or --checkpoint" in err, err


def test_config_yaml_reads_back_every_flag_the_run_was_given(run_folder, tmp_path):
    argv, run = run_folder
    _assert_read_back(argv, run)
    assert yaml.safe_load((run / "config.yaml").read_text())["label_map"] == {"Owl": "owl", "Kitty": 0, "dog": 1}
    older = tmp_path / "older.yaml"  # sopfast <= 0.5.3 wrote the map as a list of pairs
    older.write_text("label_map: [[T-shirt_top, 0], [Trouser, 1]]\n")
    tokens = config_tokens(build_parser().subcommands["train"], str(older))
    assert tokens == ["--label-map", "T-shirt_top=0", "Trouser=1"]
    further = ["train", "--checkpoint", str(run), "--no-strict-backbone", "--output-dir", str(tmp_path / "more")]
    further += ["--max-steps", "1", "--batch-size", "4", "--no-progress", "--no-diagnose", "--limit", "12"]
    assert main(further) == 0  # continues the model: its data, label map and backbone recorded
    _assert_read_back(further, tmp_path / "more")


def _assert_read_back(argv: list[str], run: Path) -> None:
    """Every flag of ``argv`` (but ``--output-dir``: a re-run trains into a new folder) has its value in the
    run's config.yaml read back with ``--config``."""
    parser = build_parser()
    defaults = vars(parser.parse_args(["train"]))
    given = {name: value for name, value in vars(parser.parse_args(argv)).items() if value != defaults.get(name, ...)}
    read = vars(parser.parse_args(["train", *config_tokens(parser.subcommands["train"], str(run / "config.yaml"))]))
    lost = {
        name: (value, read.get(name, "(absent)"))
        for name, value in given.items()
        if name != "output_dir" and _plain(name, read.get(name)) != _plain(name, value)
    }
    assert not lost, lost
    assert dict(read["label_map"]) == {"Owl": "owl", "Kitty": 0, "dog": 1}


def _plain(name: str, value: Any) -> Any:
    """``value`` compared as the run means it: paths absolute."""
    return os.path.abspath(value) if name in ("data", "checkpoint") and isinstance(value, str) else value


# -- the hostile harness ------------------------------------------------------------------------------
def _nan_weight(vit):
    broken = copy.deepcopy(vit)
    with torch.no_grad():
        broken.vit.embeddings.patch_embeddings.projection.weight[0, 0, 0, 0] = float("nan")
    return broken


# each probe: (name, call, expected) — expected is a list of fragments the error must name, or a check
# of the result; a result where an error was due is "silent", an error without the fragments "generic"
PROBES: list[tuple[str, Any, Any]] = [
    ("diagnose NaN weight", lambda vit: _diagnose(_nan_weight(vit), [0] * 8), ["projection.weight", "NaN"]),
    ("diagnose NaN input", lambda vit: _diagnose(vit, [0] * 8, x=X * float("nan")), ["images", "NaN"]),
    ("diagnose label 7", lambda vit: _diagnose(vit, [7] * 8), ["labels", "[7]", "[0, 2]"]),
    ("diagnose label -1", lambda vit: _diagnose(vit, [-1] * 8), ["labels", "[-1]", "[0, 2]"]),
    ("diagnose label 0.5", lambda vit: _diagnose(vit, [0.5] * 8), ["labels", "0.5", "[0, 2]"]),
    ("diagnose label 1.0", lambda vit: _diagnose(vit, [1.0] * 8), ["labels", "1.0", "integer class ids"]),
    ("diagnose bool labels", lambda vit: _diagnose(vit, [True] * 8), ["labels", "torch.bool"]),
    ("diagnose device tpu", lambda vit: _diagnose(vit, [0] * 8, device="tpu"), ["device 'tpu'", "cpu, cuda"]),
    ("diagnose examples 0", lambda vit: _diagnose(vit, [0] * 8, examples=0), ["examples", "0"]),
    ("diagnose 6/2 labels", lambda vit: _diagnose(vit, [0] * 6 + [2] * 2), lambda r: r.chance == 0.75),
    ("diagnose no labels", lambda vit: _diagnose(vit), lambda r: r.full_accuracy == 1.0 and r.labels != "labels"),
    ("map twice", lambda _: label_map([("cat", 0), ("cat", 1)]), ["--label-map", "'cat' twice", "cat=1"]),
    ("map cat=true", lambda _: ids(["cat"], NAMED, {"cat": True}), ["'cat' → True", "class id (an integer)"]),
    ("map cat=1.5", lambda _: ids(["cat"], NAMED, {"cat": 1.5}), ["'cat' → 1.5", "class id"]),
    ("map cat=5", lambda _: ids(["cat"], NAMED, {"cat": 5}), ["'cat' → 5", "3 classes (0..2)"]),
    ("map cat=-1", lambda _: ids(["cat"], NAMED, {"cat": -1}), ["'cat' → -1", "3 classes (0..2)"]),
    ("map cat=lion", lambda _: ids(["cat"], NAMED, {"cat": "lion"}), ["'cat' → 'lion'", "'owl'"]),
    ("map cat=Dog", lambda _: ids(["cat"], NAMED, {"cat": "Dog"}), ["'Dog' → 'dog'"]),
    ("map partial", lambda _: ids(["cat", "Owl"], NAMED, {"Owl": "owl"}), lambda r: r == [0, 2]),
    ("map by id string", lambda _: ids(["a", "b"], UNNAMED, {"a": "2", "b": 0}), lambda r: r == [2, 0]),
    ("map misses", lambda _: ids(["cat", "Kitty"], NAMED, {"cat": 0}), ["['Kitty']", "label2id"]),
    ("ids and names", lambda _: ids(["cat", "dog", "2"], UNNAMED), ["mix class ids ['2']", "['cat', 'dog']"]),
    ("id outside", lambda _: ids([0, 1, 3], NAMED), ["class ids [3]", "3 classes (0..2)"]),
    ("unknown name", lambda _: ids(["cat", "Owl"], NAMED), ["['Owl']", "'Owl' → 'owl'", "--label-map"]),
]


def _outcome(call: Any, expected: Any, vit) -> str:
    try:
        result = call(vit)
    except (ValueError, TypeError, CLIError) as err:
        if callable(expected):
            return f"generic: {err}"
        missing = [f for f in expected if f not in str(err)]
        return "clear" if not missing else f"generic: {err} (lacks {missing})"
    if callable(expected):
        return "correct" if expected(result) else f"silent: {result}"
    return f"silent: {result}"


def test_hostile_harness_is_clear_or_correct(vit):
    table = {name: _outcome(call, expected, vit) for name, call, expected in PROBES}
    bad = {name: outcome for name, outcome in table.items() if outcome not in ("clear", "correct")}
    assert not bad, "\n".join(f"{name}: {outcome}" for name, outcome in bad.items())
