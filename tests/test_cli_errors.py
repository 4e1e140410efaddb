"""Every command-line mistake ends in exit status 2 with one line on stderr, never a traceback;
``--help`` works with only the declared dependencies; and a bounded hypothesis fuzz of argv."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sopfast
import user_data as U
from sopfast.cli.app import CLIError, main
from sopfast.testing import make_hf_vit

SUBCOMMANDS = ("demo", "train", "evaluate", "explain", "bench", "convert", "theory")
OPTIONAL = ("scipy", "sklearn", "transformers", "timm", "torchvision", "datasets", "captum", "quantus", "pandas")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A tiny ViT directory, a SOP checkpoint over it, data, config files and a plain file."""
    root = tmp_path_factory.mktemp("cli")
    vit = U.vit_dir(root)
    sop = sopfast.SOP(sopfast.adapters.load_backbone(str(vit)).model, num_groups=3, tau=0.25)
    sop.save_pretrained(str(root / "ckpt"))
    (root / "plain.txt").write_text("not a directory")
    (root / "broken.yaml").write_text("data: [digits\nlimit: 3\n")
    (root / "list.json").write_text("[1, 2]")
    no_label = root / "no_label.csv"
    no_label.write_text("text,stars\ngood film,5\nbad film,1\n")
    return {
        "vit": str(vit),
        "ckpt": str(root / "ckpt"),
        "images": str(U.image_folder(root, per_class=2)),
        "bert": str(U.bert_dir(root)),
        "texts": str(U.text_csv(root)),
        "file": str(root / "plain.txt"),
        "broken": str(root / "broken.yaml"),
        "list": str(root / "list.json"),
        "no_label": str(no_label),
        "root": str(root),
    }


def run(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` with stdout/stderr captured; ``--help`` counts as exit 0."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as done:
            code = done.code
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(argv: list[str], *fragments: str) -> str:
    code, _, err = run(argv)
    assert code == 2, (argv, err)
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("sopfast") and ": error: " in lines[0], err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _config(files: dict, name: str, text: str) -> str:
    path = Path(files["root"]) / name
    path.write_text(text)
    return str(path)


# -- issue #14: the reported mistakes ------------------------------------------------------------
def test_negative_limit_and_count(files):
    assert_one_line_error(
        ["evaluate", "--backbone", files["vit"], "--checkpoint", files["ckpt"], "--limit", "-5"],
        "argument --limit: must be an integer ≥ 1, got -5",
    )
    assert_one_line_error(
        ["explain", "--backbone", files["vit"], "--checkpoint", files["ckpt"], "--count", "-1"], "argument --count"
    )
    assert_one_line_error(["train", "--backbone", files["vit"], "--val-limit", "0"], "argument --val-limit")


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--lr", "inf"], "argument --lr: must be a finite number, got inf"),
        (["--lr", "nan"], "argument --lr: must be a finite number"),
        (["--weight-decay", "-inf"], "argument --weight-decay"),
        (["--tau", "nan"], "argument --tau"),
        (["--image-mean", "0.5", "nan", "0.5"], "argument --image-mean"),
        (["--lr", "0"], "lr must be a finite number > 0.0 and ≤ 1.0 or None, got 0.0"),
        (["--lr", "1e38"], "lr must be a finite number > 0.0 and ≤ 1.0 or None, got 1e+38"),
    ],
)
def test_non_finite_numbers_are_refused_before_any_work(files, flags, fragment, tmp_path):
    assert_one_line_error(
        ["train", "--backbone", files["vit"], "--output-dir", str(tmp_path / "run"), *flags], fragment
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("device", "fragment"), [("potato", "is not a device"), ("meta", "is not supported")])
def test_bad_devices(files, device, fragment):
    assert_one_line_error(
        ["explain", "--backbone", files["vit"], "--checkpoint", files["ckpt"], "--device", device], fragment
    )
    assert_one_line_error(
        ["evaluate", "--backbone", files["vit"], "--checkpoint", files["ckpt"], "--device", device], fragment
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu(files):
    assert_one_line_error(["train", "--backbone", files["vit"], "--device", "cuda"], "CUDA is not available")
    assert_one_line_error(["bench", "--device", "cuda:1"], "CUDA is not available")


def test_yaml_syntax_error_and_bad_config_values(files):
    assert_one_line_error(["theory", "--config", files["broken"]], "is not valid YAML", "line")
    assert_one_line_error(["theory", "--config", files["list"]], "must hold a mapping")
    cases = {
        "limit: -3\n": "argument --limit",
        "quick: 3\n": "'quick' must be true or false",
        "metrics: {a: 1}\n": "must be a list of values",
        "limit: [1, 2]\n": "takes one value",
        "colour: red\n": "unknown option(s) ['colour']",
    }
    for i, (text, fragment) in enumerate(cases.items()):
        command = "demo" if "quick" in text else "evaluate"
        config = _config(files, f"c{i}.yaml", text)
        assert_one_line_error(
            [command, "--config", config, "--backbone", files["vit"], "--checkpoint", files["ckpt"]]
            if command == "evaluate"
            else [command, "--config", config],
            fragment,
        )


@pytest.mark.parametrize("name", ["mnist", "Fashion-MNIST"])
def test_config_dataset_names_are_checked_like_flags(files, name):
    config = _config(files, f"data-{name}.yaml", f"data: {name}\nbackbone: {files['bert']}\n")
    assert_one_line_error(["train", "--config", config], f"--data '{name}' is neither a built-in dataset")


def test_output_paths_that_are_files_or_folders(files):
    model = ["--backbone", files["vit"], "--checkpoint", files["ckpt"], "--data", files["images"]]
    assert_one_line_error(["explain", *model, "--out", files["file"]], "exists and is not a directory")
    assert_one_line_error(
        ["train", "--backbone", files["vit"], "--output-dir", files["file"]], "--output-dir", "is not a directory"
    )
    assert_one_line_error(["evaluate", *model, "--output", files["root"]], "is a directory; give a file path")
    assert_one_line_error(["evaluate", *model, "--output", files["file"] + "/r.json"], "is not a directory")
    assert_one_line_error(["demo", "--out", files["file"]], "exists and is not a directory")
    assert_one_line_error(["theory", "--out", files["root"]], "is a directory")


def test_bench_batch_zero():
    assert_one_line_error(["bench", "--batch", "0"], "argument --batch: must be an integer ≥ 1, got 0")


def test_backbone_and_checkpoint_come_from_config_and_output_folders_are_made_first(files, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(
        "sopfast.cli.commands.evaluate.evaluate", lambda model, loader, **kw: seen.append(1) or {"SOP": {"examples": 2}}
    )
    config = _config(
        files,
        "model.yaml",
        json.dumps({"backbone": files["vit"], "checkpoint": files["ckpt"], "data": files["images"], "limit": 2}),
    )
    out = Path(files["root"]) / "new" / "folder" / "res.json"
    assert main(["evaluate", "--config", config, "--output", str(out)]) == 0
    assert seen == [1] and out.parent.is_dir() and json.loads(out.read_text())["SOP"]["examples"] == 2
    assert_one_line_error(["evaluate", "--config", config, "--output", files["file"] + "/x/res.json"])
    assert len(seen) == 1  # the bad output path failed before any evaluation


def test_config_is_read_after_root_options(files):
    config = _config(files, "root.yaml", "limit: -2\n")
    model = ["--backbone", files["vit"], "--checkpoint", files["ckpt"]]
    with pytest.raises(CLIError, match="argument --limit"):
        main(["--debug", "evaluate", "--config", config, *model])


def test_command_line_flags_win_over_the_config(files, monkeypatch):
    seen = []
    monkeypatch.setattr(
        "sopfast.explain.write_explanations", lambda model, dataset, out, **kw: seen.append(len(dataset)) or []
    )
    config = _config(
        files,
        "explain.yaml",
        f"backbone: {files['vit']}\ncheckpoint: {files['ckpt']}\ncount: 5\ndata: {files['images']}\nholdout: 0.5\n",
    )
    assert run(["explain", "--config", config])[0] == 0
    assert run(["explain", "--config", config, "--count", "2"])[0] == 0
    assert seen == [3, 2]


# -- issue #15: bad paths, missing columns, unsupported models --------------------------------------
def test_bad_paths(files):
    model = ["--backbone", files["vit"], "--checkpoint", files["ckpt"]]
    assert_one_line_error(["evaluate", *model, "--data", files["root"] + "/nope"], "neither a built-in dataset")
    assert_one_line_error(
        ["evaluate", "--backbone", files["vit"], "--checkpoint", files["root"] + "/nope"],
        "--checkpoint directory not found",
    )
    assert_one_line_error(
        ["train", "--backbone", "timm:test_vit", "--backbone-weights", files["root"] + "/w.pth"],
        "--backbone-weights file not found",
    )
    assert_one_line_error(
        ["train", "--backbone", "timm:test_vit", "--backbone-weights", files["file"]], "expected one of .safetensors"
    )
    assert_one_line_error(["train", "--backbone", "timm:test_vit"], "needs --backbone-weights")
    assert_one_line_error(["train", "--backbone", files["file"]], "--trust-pickle")
    assert_one_line_error(["evaluate", *model, "--data", files["file"]], "is a file but not")
    assert_one_line_error(["train", "--backbone", files["root"]], "not a Hugging Face model directory")


def test_missing_columns(files):
    bert = ["train", "--backbone", files["bert"]]
    assert_one_line_error([*bert, "--data", files["no_label"]], "has no label column", "--label-column")
    assert_one_line_error([*bert, "--data", files["texts"], "--text-column", "body"], "no text column 'body'")
    assert_one_line_error([*bert, "--data", files["texts"], "--text-pair-column", "second"], "no text-pair column")
    assert_one_line_error(["train", "--backbone", files["vit"], "--data", files["texts"]], "has no image column")
    assert_one_line_error([*bert, "--data", files["images"]], "is an image folder but the backbone is a text model")


def test_data_that_does_not_fit_the_backbone(files):
    assert_one_line_error(
        ["train", "--backbone", files["vit"], "--data", "digits"],
        "--data digits (train) does not fit the backbone: images must have 3 channels",
    )


def test_unsupported_models(files, tmp_path):
    from transformers import MPNetConfig, MPNetForSequenceClassification

    config = MPNetConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    MPNetForSequenceClassification(config).save_pretrained(tmp_path / "mpnet")
    line = assert_one_line_error(
        ["train", "--backbone", str(tmp_path / "mpnet")], "no sopfast adapter", "'mpnet'", "supported are"
    )
    assert "ViTForImageClassification" in line and "timm VisionTransformer" in line
    assert_one_line_error(
        ["train", "--backbone", "timm:test_vti", "--backbone-weights", files["file"]], "no such timm model", "test_vit"
    )
    assert_one_line_error(
        ["train", "--backbone", files["vit"], "--feature-layer", "layer3"], "is an option of other backbone families"
    )


def test_cnn_without_feature_layer(tmp_path):
    import torchvision

    weights = tmp_path / "m.pth"  # a CNN without a family of its own (torchvision ResNets default to layer3)
    torch.save(torchvision.models.mobilenet_v3_small(num_classes=2).state_dict(), weights)
    source = ["train", "--backbone", "torchvision:mobilenet_v3_small", "--backbone-weights", str(weights)]
    assert_one_line_error(source, "CNN backbones need feature_layer=NAME (--feature-layer)")
    assert_one_line_error([*source, "--feature-layer", "layer9"], "'layer9' is not a module")
    assert_one_line_error(
        [
            "train",
            "--backbone",
            "torchvision:mobilenet_v3_small",
            "--backbone-weights",
            str(weights),
            "--feature-layer",
            "features.9",
            "--data",
            "tweets",
        ],
        "tweets is text data",
    )


def test_debug_shows_the_traceback(files):
    with pytest.raises(Exception, match="neither a built-in dataset"):
        main(["evaluate", "--backbone", files["vit"], "--checkpoint", files["ckpt"], "--data", "mnist", "--debug"])


# -- declared dependencies only -----------------------------------------------------------------------
def test_every_help_works_without_optional_packages():
    """Block the optional packages (import raises ImportError) and ask every subcommand for --help."""
    script = (
        "import sys\n"
        f"for name in {OPTIONAL!r}: sys.modules[name] = None\n"
        "from sopfast.cli import CLIError, main\n"
        f"for command in ([], *([c] for c in {SUBCOMMANDS!r})):\n"
        "    try:\n"
        "        main([*command, '--help'])\n"
        "    except SystemExit as done:\n"
        "        assert done.code == 0, (command, done.code)\n"
        "    else:\n"
        "        raise AssertionError(command)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]
    assert result.stdout.count("usage: sopfast") == len(SUBCOMMANDS) + 1


def test_help_imports_no_optional_package():
    script = (
        "import sys\nfrom sopfast.cli import CLIError, main\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip().endswith("[]"), result.stdout[-500:] + result.stderr[-2000:]


# -- fuzz -------------------------------------------------------------------------------------------
FLAGS = [
    "--backbone",
    "--checkpoint",
    "--data",
    "--limit",
    "--count",
    "--device",
    "--config",
    "--out",
    "--output",
    "--output-dir",
    "--batch",
    "--batch-size",
    "--num-groups",
    "--tau",
    "--mode",
    "--holdout",
    "--image-size",
    "--image-std",
    "--text-column",
    "--label-column",
    "--split",
    "--train-split",
    "--feature-layer",
    "--backbone-weights",
    "--trust-pickle",
    "--metrics",
    "--epochs",
    "--lr",
    "--seed",
    "--max-d",
    "--kind",
    "--model",
    "--authors",
    "--task",
    "--quick",
    "--help",
    "--val-limit",
    "--taus",
    "--max-length",
    "--log-file",
]
VALUES = [
    "-5",
    "0",
    "1",
    "3",
    "0.5",
    "-1",
    "nan",
    "1e9",
    "abc",
    "cpu",
    "cuda",
    "potato",
    "timm:test_vit",
    "timm:x",
    "digits",
    "tweets",
    "fashion-mnist",
    "mnist",
    "accuracy",
    "exact",
    "drop",
    "",
    "=",
    "-",
    "layer3",
]
FILE_KEYS = ["vit", "ckpt", "images", "bert", "texts", "file", "broken", "list", "no_label", "root"]


def _fuzz_stubs(monkeypatch) -> None:
    """Stop every valid command before its real work: the fuzz is about parsing, checking and loading."""
    done = sopfast.TrainResult(0, 0, None, None)
    monkeypatch.setattr("sopfast.training.train", lambda *a, **k: done)
    monkeypatch.setattr("sopfast.cli.commands.evaluate.evaluate", lambda *a, **k: {"SOP": {"examples": 1}})
    monkeypatch.setattr("sopfast.demo.run.run_demo", lambda **k: {})
    monkeypatch.setattr("sopfast.benchmark.run_bench", lambda *a, **k: "")
    monkeypatch.setattr("sopfast.explain.write_explanations", lambda *a, **k: [])
    monkeypatch.setattr("sopfast.cli.commands.theory.run", lambda args: 0)
    monkeypatch.setattr(sopfast.SOP, "from_authors", lambda *a, **k: sopfast.SOP(make_hf_vit(), num_groups=2))


def _check_run(argv: list[str]) -> None:
    code, out, err = run(argv)
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if code == 2:
        lines = err.strip("\n").split("\n")
        assert len(lines) == 1 and ": error: " in lines[0], (argv, err)


def _fuzz(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@_fuzz(250)
@given(data=st.data())
def test_fuzz_any_argv_ends_in_exit_0_or_one_line_exit_2(files, monkeypatch, tmp_path, data):
    _fuzz_stubs(monkeypatch)
    monkeypatch.chdir(tmp_path)
    token = st.one_of(
        st.sampled_from(FLAGS), st.sampled_from(VALUES), st.sampled_from(FILE_KEYS).map(files.get), st.text(max_size=4)
    )
    _check_run(
        [data.draw(st.sampled_from([*SUBCOMMANDS, "fly", "--help", ""])), *data.draw(st.lists(token, max_size=8))]
    )


@_fuzz(120)
@given(data=st.data())
def test_fuzz_valid_commands_with_extra_options(files, monkeypatch, tmp_path, data):
    """Start from commands that work and add a few flag/value pairs: reaches the backbone and data checks."""
    _fuzz_stubs(monkeypatch)
    monkeypatch.chdir(tmp_path)
    bases = [
        ["train", "--backbone", files["vit"], "--data", files["images"]],
        ["train", "--backbone", files["bert"], "--data", files["texts"]],
        ["evaluate", "--backbone", files["vit"], "--checkpoint", files["ckpt"], "--data", files["images"]],
        ["explain", "--backbone", files["vit"], "--checkpoint", files["ckpt"], "--data", files["images"]],
        ["theory"],
        ["bench"],
        ["demo"],
    ]
    value = st.one_of(st.sampled_from(VALUES), st.sampled_from(FILE_KEYS).map(files.get), st.text(max_size=4))
    pairs = data.draw(st.lists(st.tuples(st.sampled_from([f for f in FLAGS if f != "--help"]), value), max_size=3))
    _check_run([*data.draw(st.sampled_from(bases)), *[t for pair in pairs for t in pair]])
