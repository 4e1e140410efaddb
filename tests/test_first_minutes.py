"""A user's first minutes (issue #43): ``sopfast --version`` at once, ``sopfast.train`` on a Dataset
without a batch size, a Ctrl-C that says how to resume, each line printed once (once per ``torchrun``
job), and the tokens of a text prediction."""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

import sopfast
import user_data as U
from sopfast.cli.app import main
from sopfast.cli.common import configure_logging, report
from sopfast.data.datasets import TextDataset
from sopfast.defaults import BATCH_SIZE
from sopfast.training import TrainConfig

FAST = ["--batch-size", "4", "--num-groups", "4", "--no-progress", "--no-diagnose", "--seed", "0"]


def run(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` with stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# -- sopfast --version and --help import no torch --------------------------------------------------------
@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_the_top_level_command_answers_without_importing_torch(argv):
    script = (
        "import sys\nfrom sopfast.cli import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as done:\n    code = done.code\nprint('exit', code)\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().endswith("torch imported: False"), result.stdout + result.stderr
    if argv == ["--version"]:
        assert f"sopfast {sopfast.__version__}" in result.stdout and "exit 0" in result.stdout
    if argv == ["--help"]:
        assert all(name in result.stdout for name in ("train", "evaluate", "predict", "theory"))
    if argv == []:
        assert "exit 2" in result.stdout and "required: command" in result.stderr


def test_import_sopfast_imports_no_torch_until_a_name_is_used():
    script = (
        "import sys, sopfast\nprint('torch' in sys.modules)\n"
        "sopfast.SOP, sopfast.explain.to_input_space, sopfast.ops.backends\nprint('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["False", "True"], result.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sopfast.nothing  # noqa: B018
    assert all(getattr(sopfast, name) is not None for name in sopfast.__all__)
    assert set(sopfast.__all__) <= set(dir(sopfast))
    assert sopfast.SOP is sopfast.model.SOP and sopfast.train is sopfast.training.train


# -- sopfast.train's batch size is the command line's ---------------------------------------------------
def test_train_batches_a_dataset_like_the_command_line():
    from sopfast.cli import build_parser

    assert TrainConfig().batch_size == BATCH_SIZE == 32
    assert "default 32, as ``sopfast train``" in " ".join(TrainConfig.__doc__.split())
    shown = " ".join(build_parser(["train"]).subcommands["train"].format_help().split())
    assert "(a DataLoader keeps its own; default 32, as sopfast train). (default: 32)" in shown
    model = sopfast.SOP(sopfast.testing.make_hf_vit(), num_groups=3)
    data = torch.utils.data.TensorDataset(torch.randn(40, 3, 32, 32), torch.arange(40) % 3)
    assert sopfast.train(model, data, epochs=1, diagnose=False, progress=False).step == 2  # 32 + 8


# -- Ctrl-C in sopfast train -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("first")
    vit = U.vit_dir(root)
    sop = sopfast.SOP(sopfast.adapters.load_backbone(str(vit)).model, num_groups=3, tau=0.25)
    sop.save_pretrained(str(root / "ckpt"))
    return {"vit": str(vit), "ckpt": str(root / "ckpt"), "images": str(U.image_folder(root, per_class=3))}


def _interrupt_after_the_first_save(monkeypatch) -> None:
    """Ctrl-C right after the trainer wrote its first training state."""
    from sopfast.training import trainer

    save = trainer.save_training_state

    def save_then_interrupt(*args, **kwargs):
        save(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "save_training_state", save_then_interrupt)


def test_ctrl_c_says_the_same_command_resumes_and_it_does(files, tmp_path, monkeypatch):
    argv = ["train", "--backbone", files["vit"], "--data", files["images"], "--epochs", "2", *FAST]
    argv += ["--output-dir", str(tmp_path / "run")]
    with monkeypatch.context() as patch:
        _interrupt_after_the_first_save(patch)
        code, _, err = run(argv)
    state = tmp_path / "run" / "training_state.pt"
    assert code == 130 and state.is_file()
    assert err.splitlines()[-1] == (
        f"sopfast train: interrupted; the same command resumes from the last saved training state ({state})"
    )
    code, out, err = run(argv)
    assert code == 0 and "resuming from step" in err and "model saved" in out, err


def test_ctrl_c_without_output_dir_names_the_run_folder_to_resume(files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--backbone", files["vit"], "--data", files["images"], "--epochs", "2", "--no-resume", *FAST]
    with monkeypatch.context() as patch:
        _interrupt_after_the_first_save(patch)
        code, _, err = run(argv)
    (folder,) = (tmp_path / "runs").iterdir()
    shown = Path("runs") / folder.name
    assert code == 130
    assert err.splitlines()[-1] == (
        f"sopfast train: interrupted; the same command with --output-dir {shown} and without --no-resume "
        f"resumes from the last saved training state ({shown / 'training_state.pt'})"
    )
    code, _, err = run([a for a in argv if a != "--no-resume"] + ["--output-dir", str(shown)])
    assert code == 0 and "resuming from step" in err, err


def test_ctrl_c_before_any_training_state_is_only_interrupted(files, tmp_path, monkeypatch):
    from sopfast.training.trainer import Trainer

    def stop(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_setup", stop)
    argv = ["train", "--backbone", files["vit"], "--data", files["images"], *FAST]
    code, _, err = run([*argv, "--output-dir", str(tmp_path / "run")])
    assert code == 130 and err.splitlines()[-1] == "sopfast train: interrupted"


# -- each line once --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("rank", "shown"), [(None, True), ("0", True), ("1", False)])
def test_report_lines_come_from_rank_0_only(rank, shown, monkeypatch):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    configure_logging(0)
    report("test data: somewhere")
    logging.getLogger("sopfast.cli").warning("a warning")
    assert ("test data: somewhere" in err.getvalue()) == shown
    assert "sopfast: warning: a warning" in err.getvalue()  # every process says what went wrong


def test_evaluate_says_which_data_once(files):
    code, out, err = run(["evaluate", "--checkpoint", files["ckpt"], "--backbone", files["vit"], "--data",
                          files["images"], "--metrics", "accuracy", "--no-progress"])  # fmt: skip
    assert code == 0, err
    assert (out + err).count("test data:") == 1 and out.startswith("test data:")


# -- the tokens of a text prediction ---------------------------------------------------------------------
def _bert(tmp_path: Path):
    from transformers import AutoTokenizer

    directory = U.bert_dir(tmp_path)
    return sopfast.adapters.load_backbone(str(directory)).model, AutoTokenizer.from_pretrained(directory), directory


def test_text_predictions_hold_each_positions_token(tmp_path):
    backbone, tokenizer, _ = _bert(tmp_path)
    texts = ["a good film", "the plot is not very fun at all", "bad"]
    data = TextDataset.tokenize(tokenizer, texts, [1, 0, 0], pairs=["great", "boring", "love it"])
    model = sopfast.SOP(backbone, num_groups=3, tau=0.3, mode="drop")
    sopfast.predict(model, data, tmp_path / "out", batch_size=2, num_workers=0, progress=False)
    rows = pq.read_table(tmp_path / "out" / "data").to_pylist()
    ids, mask = data.encoded["input_ids"], data.encoded["attention_mask"]
    for row, example, kept in zip(rows, ids, mask):
        expected = tokenizer.convert_ids_to_tokens(example.tolist())
        assert row["tokens"] == [t if k else None for t, k in zip(expected, kept.tolist())]
        assert all(row["tokens"][f] not in (None, "[PAD]") for group in row["groups"] for f in group)
    assert rows[0]["tokens"][:4] == ["[CLS]", "a", "good", "film"] and rows[2]["tokens"][-1] is None
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| `tokens` | list of string" in card


def test_images_and_token_ids_without_a_tokenizer_have_no_tokens_column(tmp_path):
    backbone, tokenizer, _ = _bert(tmp_path)
    data = TextDataset.tokenize(tokenizer, ["a good film", "bad"], [1, 0])
    data.tokenizer = None
    sopfast.predict(sopfast.SOP(backbone, num_groups=3), data, tmp_path / "text", num_workers=0, progress=False)
    images = torch.utils.data.TensorDataset(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))
    vit = sopfast.testing.make_hf_vit()
    sopfast.predict(sopfast.SOP(vit, num_groups=3), images, tmp_path / "images", num_workers=0, progress=False)
    for out in ("text", "images"):
        assert "tokens" not in pq.read_table(tmp_path / out / "data").column_names


def test_sopfast_predict_writes_the_tokens_of_a_csv(tmp_path):
    backbone, _, directory = _bert(tmp_path)
    sopfast.SOP(backbone, num_groups=3, tau=0.3).save_pretrained(str(tmp_path / "ckpt"))
    csv = U.text_csv(tmp_path)
    argv = ["predict", "--backbone", str(directory), "--checkpoint", str(tmp_path / "ckpt"), "--data", str(csv)]
    code, _, err = run([*argv, "--output-dir", str(tmp_path / "preds"), "--num-workers", "0", "--no-progress"])
    assert code == 0, err
    rows = pq.read_table(tmp_path / "preds" / "data").to_pylist()
    assert rows and all(row["tokens"][0] == "[CLS]" and "[SEP]" in row["tokens"] for row in rows)
