"""Nothing lost, nothing silently wrong in the files sopfast writes (issue #42): ``sopfast adapt`` and every
command that writes a model never write over a model they were not told to replace, nor ever into the
input's own folder, and write all-or-nothing; checksums of 0.4+ checkpoints and training states cannot be
stripped; a run folder with damaged logs resumes from its training state; the errors of these paths are
one clear line.  A hostile harness at the end: every probe is a clear error naming the argument or the
file, or a correct result."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import TensorDataset

import sopfast
from sopfast.adapters.sources import load_backbone
from sopfast.cli.app import main
from sopfast.masking.adapt import PROVENANCE_NAME, save_adapted
from sopfast.model.checkpoint import (
    CONFIG_NAME,
    STATE_NAME,
    WEIGHTS_NAME,
    hash_backbone,
    load_training_state,
    save_training_state,
)
from sopfast.testing import make_hf_vit
from sopfast.training import train

ADAPT = dict(steps=1, batch_size=4, num_groups=2, progress=False)
RUN = dict(batch_size=2, max_steps=1, progress=False, log_every=1, diagnose_examples=4)


def images(n: int = 8, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 3, (n,), generator=g))


def digest(folder: Path) -> dict[str, str]:
    """The SHA-256 of every file under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def hidden(folder: Path) -> list[str]:
    """Temp files and folders left in ``folder``."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


@pytest.fixture
def vit_dir(tmp_path) -> Path:
    import user_data as U

    return U.vit_dir(tmp_path / "backbone")


@pytest.fixture
def said(caplog):
    """What sopfast's loggers said (the ``sopfast`` logger stops propagating once a CLI test ran)."""
    logger = logging.getLogger("sopfast")
    logger.addHandler(caplog.handler)
    with caplog.at_level(logging.WARNING, logger="sopfast"):
        yield lambda: caplog.text
    logger.removeHandler(caplog.handler)


def one_line(code: int, err: str) -> str:
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    return err


# -- 1. a model sopfast did not make is never written ---------------------------------------------------
def test_cli_adapt_into_the_backbones_own_folder_changes_no_byte(vit_dir, tmp_path, capsys):
    import user_data as U

    data = U.image_folder(tmp_path, per_class=4)
    (tmp_path / "link").symlink_to(vit_dir)
    before = digest(vit_dir)
    capsys.readouterr()
    for out, extra in ((vit_dir, []), (tmp_path / "link", []), (vit_dir, ["--overwrite"])):
        argv = ["adapt", "--backbone", str(vit_dir), "--data", str(data), "--output-dir", str(out)]
        err = one_line(
            main([*argv, "--steps", "1", "--batch-size", "4", "--no-progress", *extra]), capsys.readouterr().err
        )
        assert "--output-dir" in err and "folder of the model it is made from" in err, err
        assert digest(vit_dir) == before


def test_cli_adapt_into_another_models_folder_refuses(vit_dir, tmp_path, capsys):
    import user_data as U

    other, data = U.vit_dir(tmp_path / "other"), U.image_folder(tmp_path, per_class=4)
    before = digest(other)
    capsys.readouterr()
    argv = ["adapt", "--backbone", str(vit_dir), "--data", str(data), "--output-dir", str(other), "--steps", "1"]
    err = one_line(main(argv), capsys.readouterr().err)
    assert "already holds a model" in err and "--overwrite" in err and digest(other) == before


def test_a_second_adapt_refuses_and_with_overwrite_replaces_it_whole(vit_dir, tmp_path):
    backbone = load_backbone(str(vit_dir))
    out = tmp_path / "adapted"
    first = sopfast.adapt_backbone(backbone, images(), output_dir=out, **ADAPT)
    (out / "notes.txt").write_text("mine")
    before = digest(out)
    with pytest.raises(ValueError, match=r"output_dir .*adapted already holds a model .*overwrite=True"):
        sopfast.adapt_backbone(backbone, images(), output_dir=out, seed=1, **ADAPT)
    assert digest(out) == before
    second = sopfast.adapt_backbone(backbone, images(), output_dir=out, seed=1, overwrite=True, **ADAPT)
    provenance = json.loads((out / PROVENANCE_NAME).read_text())
    assert provenance["original_sha256"] == hash_backbone(backbone.model)
    assert provenance["adapted_sha256"] == hash_backbone(second.backbone) != hash_backbone(first.backbone)
    assert hash_backbone(load_backbone(str(out)).model) == provenance["adapted_sha256"]
    assert (out / "notes.txt").read_text() == "mine" and hidden(tmp_path) == []
    with pytest.raises(ValueError, match=r"is the folder of the model it is made from.*not even with overwrite=True"):
        sopfast.adapt_backbone(backbone, images(), output_dir=vit_dir, overwrite=True, **ADAPT)


def test_a_crash_while_saving_the_adapted_copy_leaves_no_half_written_model(vit_dir, tmp_path, monkeypatch):
    def killed(origin, out):
        raise KeyboardInterrupt

    monkeypatch.setattr("sopfast.masking.adapt._copy_preprocessing", killed)
    with pytest.raises(KeyboardInterrupt):
        sopfast.adapt_backbone(load_backbone(str(vit_dir)), images(), output_dir=tmp_path / "adapted", **ADAPT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backbone"]  # neither the folder nor its temp copy


def test_the_temp_folder_of_a_killed_write_is_removed_by_the_next(tmp_path):
    from sopfast.model.state_files import write_model_folder

    stale = tmp_path / ".m.999999999.0123abcd.tmp"  # no process has that id
    (stale / "half").mkdir(parents=True)
    write_model_folder(tmp_path / "m", lambda folder: (folder / "model.safetensors").write_bytes(b"w"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_save_pretrained_never_writes_over_a_model_it_did_not_make(vit_dir, tmp_path):
    import user_data as U

    model = sopfast.SOP(load_backbone(str(vit_dir)), num_groups=2)
    before = digest(vit_dir)
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"directory .* is the folder of the model it is made from"):
            model.save_pretrained(vit_dir, overwrite=overwrite)
    assert digest(vit_dir) == before
    other = U.vit_dir(tmp_path / "other")
    with pytest.raises(ValueError, match=r"already holds a model \(\['config.json', 'model.safetensors'"):
        model.save_pretrained(other)
    model.save_pretrained(other, overwrite=True)  # named: the other model's files are replaced
    assert sorted(os.listdir(other)) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]
    model.save_pretrained(other)  # an SOP checkpoint is re-saved as before
    assert sopfast.SOP.from_pretrained(other, model.backbone).num_groups == 2
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("mine")
    with pytest.raises(ValueError, match=r"already holds \['README.md'\], which sopfast did not write"):
        model.save_pretrained(tmp_path / "notes")
    assert (tmp_path / "notes" / "README.md").read_text() == "mine"


def test_cli_convert_never_writes_into_its_inputs(vit_dir, tmp_path, capsys):
    (tmp_path / "authors").mkdir()
    before = digest(vit_dir)
    capsys.readouterr()
    for out in (vit_dir, tmp_path / "authors"):
        argv = ["convert", "--authors", str(tmp_path / "authors"), "--backbone", str(vit_dir), "--out", str(out)]
        err = one_line(main([*argv, "--overwrite"]), capsys.readouterr().err)
        assert "--out" in err and "is the folder of the model it is made from" in err, err
    assert digest(vit_dir) == before


def test_cli_demo_refuses_a_models_folder(vit_dir, capsys):
    before = digest(vit_dir)
    capsys.readouterr()
    err = one_line(main(["demo", "--quick", "--out", str(vit_dir), "--device", "cpu"]), capsys.readouterr().err)
    assert "out_dir (--out)" in err and "holds a model" in err and digest(vit_dir) == before


def test_train_refuses_a_models_folder_as_its_run_folder(vit_dir):
    model = sopfast.SOP(load_backbone(str(vit_dir)), num_groups=2)
    before = digest(vit_dir)
    with pytest.raises(ValueError, match=r"output_dir \(--output-dir\) .* holds a model .*choose another"):
        train(model, images(4), output_dir=vit_dir, **RUN)
    assert digest(vit_dir) == before


# -- 2. checksums of 0.4+ files are required ----------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    model = sopfast.SOP(make_hf_vit(), num_groups=4).eval()
    model.save_pretrained(tmp_path / "m")
    return model, tmp_path / "m"


def _tamper(path: Path, strip) -> None:
    """Strip the checksum(s) of a saved model with ``strip(meta)`` and change one of its weights."""
    meta = json.loads((path / CONFIG_NAME).read_text())
    strip(meta)
    (path / CONFIG_NAME).write_text(json.dumps(meta))
    weights = load_file(path / WEIGHTS_NAME)
    weights["generator.heads.0"] = weights["generator.heads.0"] + 1
    save_file(weights, path / WEIGHTS_NAME)


def test_a_checkpoint_stripped_of_its_checksums_is_refused(saved):
    model, path = saved
    _tamper(path, lambda meta: meta.pop("sha256"))
    with pytest.raises(ValueError, match=f"{CONFIG_NAME} holds no sha256 entry, which sopfast .* writes"):
        sopfast.SOP.from_pretrained(path, model.backbone)


def test_a_checkpoint_stripped_of_its_weights_checksum_is_refused(saved):
    model, path = saved
    _tamper(path, lambda meta: meta["sha256"].pop(WEIGHTS_NAME))
    with pytest.raises(ValueError, match=f"{CONFIG_NAME} does not match its recorded SHA-256"):
        sopfast.SOP.from_pretrained(path, model.backbone)


@pytest.fixture
def run(tmp_path):
    """A run folder after one step (with its diagnosis, log and metrics)."""
    train(sopfast.SOP(make_hf_vit(), num_groups=4), images(4), images(4), output_dir=tmp_path, **RUN)
    return tmp_path


def _resume(run: Path, **options):
    return train(sopfast.SOP(make_hf_vit(), num_groups=4), images(4), images(4), output_dir=run, **{**RUN, **options})


def test_a_training_state_stripped_of_its_checksum_is_refused(run):
    state = load_training_state(run / STATE_NAME)
    del state["sha256"]
    torch.save(state, run / STATE_NAME)
    with pytest.raises(ValueError, match=f"{STATE_NAME} holds no sha256 entry, which sopfast .* writes"):
        load_training_state(run / STATE_NAME)
    del state["sopfast_version"]  # now it looks like a state of 0.3.0, but records what only 0.4+ records
    torch.save(state, run / STATE_NAME)
    with pytest.raises(ValueError, match=r"no sha256 entry, yet records .* which only sopfast 0.4"):
        _resume(run, max_steps=2)


def test_a_training_state_with_a_best_metric_that_is_no_number_is_refused(run):
    state = load_training_state(run / STATE_NAME)
    state["best_metric"] = "x"
    save_training_state(state, run / STATE_NAME)
    with pytest.raises(ValueError, match=f"{STATE_NAME}: best_metric is 'x', not a finite number or None"):
        _resume(run, max_steps=2)


# -- 3. a run folder with damaged logs resumes from its training state ---------------------------------
def _garble(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40] + b"\xff\xfe{not json\n")


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


@pytest.mark.parametrize("damage", [_garble, _cut], ids=["garbled", "cut"])
@pytest.mark.parametrize("name", ["log.jsonl", "metrics.csv", "diagnosis.json"])
def test_damaged_logs_are_set_aside_and_the_run_resumes(run, name, damage, said):
    damage(run / name)
    damaged = (run / name).read_bytes()
    result = _resume(run, max_steps=2)
    assert result.step == 2
    assert (run / f"{name}.damaged-1").read_bytes() == damaged
    assert f"{run / name} is damaged" in said() and f"{name}.damaged-1" in said()
    if name == "diagnosis.json":  # the log's record stands in for it
        assert result.diagnosis is not None and result.diagnosis["examples"] == 4
    else:
        assert (run / name).read_text(encoding="utf-8").endswith("\n")


# -- 4. errors that name what is wrong ---------------------------------------------------------------
def test_adapt_blames_a_nan_backbone_not_the_learning_rate():
    vit = make_hf_vit()
    name, weight = [(n, p) for n, p in vit.named_parameters() if p.dim() == 2][2]
    with torch.no_grad():
        weight[0, 0] = math.nan
    with pytest.raises(ValueError, match=rf"backbone holds NaN or infinite values in \['{re.escape(name)}'\]") as err:
        sopfast.adapt_backbone(vit, images(), **ADAPT)
    assert "lr" not in str(err.value)


def test_adapt_blames_an_overflowing_backbone_output_not_the_learning_rate():
    vit = make_hf_vit()
    with torch.no_grad():
        vit.classifier.weight.copy_(1e38 * torch.randn_like(vit.classifier.weight).sign())
    with pytest.raises(ValueError, match=r"backbone's outputs? (on the batch of step 1 is|are) not finite") as err:
        sopfast.adapt_backbone(vit, images(), **ADAPT)  # the diagnostic before training, or the first step
    assert "lr" not in str(err.value)


def test_push_to_hub_without_a_network_says_so(monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    model = sopfast.SOP(make_hf_vit(), num_groups=2)
    with pytest.raises(ConnectionError, match=r"push_to_hub\('user/x'\): no network reachable.*save_pretrained"):
        model.push_to_hub("user/x", token="hf_none")


# -- 5. the hostile harness -----------------------------------------------------------------------------
def _model_dir(model: sopfast.SOP, path: Path, edit=None, *, reseal: bool = True, weights=None) -> Path:
    """``model`` saved in ``path``, its config changed by ``edit(meta)`` (its own checksum made to fit with
    ``reseal``), its weights file replaced by the bytes ``weights(data)``."""
    from sopfast.model.checkpoint import _config_sha256

    model.save_pretrained(path)
    if edit is not None:
        meta = json.loads((path / CONFIG_NAME).read_text())
        edit(meta)
        if reseal:
            meta["sha256"][CONFIG_NAME] = _config_sha256(meta)
        (path / CONFIG_NAME).write_text(json.dumps(meta))
    if weights is not None:
        (path / WEIGHTS_NAME).write_bytes(weights((path / WEIGHTS_NAME).read_bytes()))
    return path


def _file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _state(path: Path, obj) -> Path:
    torch.save(obj, path)
    return path


def _probes(tmp: Path) -> dict:
    """name → (what to run, then the regex its error must match, or a check of its correct result)."""
    vit = make_hf_vit()
    model = sopfast.SOP(vit, num_groups=2)
    sealed = tmp / "state.pt"
    save_training_state({"step": 1, "w": torch.ones(3)}, sealed)
    stripped = {k: v for k, v in load_training_state(sealed).items() if k != "sha256"}
    _file(tmp / "file", b"x")
    _model_dir(model, tmp / "run" / "best")
    _file(tmp / "run" / "diagnosis.json", b"{cut")

    def load(path: Path):
        return lambda: sopfast.SOP.from_pretrained(path, vit)

    def with_provenance(value):
        other = sopfast.SOP(vit, num_groups=2)
        other.provenance = value
        return other

    return {
        "adapt output_dir is a file": (
            lambda: sopfast.adapt_backbone(vit, images(), output_dir=tmp / "file", **ADAPT),
            "output_dir must be a directory",
        ),
        "adapt overwrite='yes'": (lambda: sopfast.adapt_backbone(vit, images(), overwrite="yes", **ADAPT), "overwrite"),
        "adapt device='cuda'": (
            lambda: sopfast.adapt_backbone(vit, images(), device="cuda", **ADAPT),
            (lambda result: result.after.examples == 8)
            if torch.cuda.is_available()
            else "device 'cuda': CUDA is not available on this machine",
        ),
        "save_adapted provenance str": (lambda: save_adapted(vit, "x", tmp / "a"), "provenance must be a dict"),
        "save_pretrained provenance str": (
            lambda: with_provenance("x").save_pretrained(tmp / "p"),
            "model.provenance must be a dict",
        ),
        "save_pretrained overwrite=1": (lambda: model.save_pretrained(tmp / "o", overwrite=1), "overwrite"),
        "config not JSON": (load(_file(tmp / "j" / CONFIG_NAME, b"{cut").parent), "j/sop_config.json is not a valid"),
        "config not UTF-8": (load(_file(tmp / "u" / CONFIG_NAME, b"\xff\xfe").parent), "u/sop_config.json is not a"),
        "config provenance str": (
            load(_model_dir(model, tmp / "pv", lambda m: m.update(provenance="x"))),
            "pv/sop_config.json: provenance is 'x', not a mapping",
        ),
        "config sha256 str": (
            load(_model_dir(model, tmp / "s", lambda m: m.update(sha256="x"), reseal=False)),
            "s/sop_config.json does not match its recorded SHA-256",
        ),
        "config sha256 stripped": (
            load(_model_dir(model, tmp / "n", lambda m: m.pop("sha256"), reseal=False)),
            "n/sop_config.json holds no sha256 entry",
        ),
        "weights cut": (
            load(_model_dir(model, tmp / "w", weights=lambda data: data[:-9])),
            f"w/{WEIGHTS_NAME} does not match the SHA-256 recorded",
        ),
        "run folder with a damaged diagnosis.json": (
            load(tmp / "run"),
            lambda loaded: loaded.provenance.get("diagnosis") is None,
        ),
        "state cut": (
            lambda: load_training_state(_file(tmp / "cut.pt", sealed.read_bytes()[:-20])),
            "cut.pt is not a readable training state",
        ),
        "state stripped": (
            lambda: load_training_state(_state(tmp / "stripped.pt", stripped)),
            "stripped.pt holds no sha256 entry",
        ),
        "state a list": (lambda: load_training_state(_state(tmp / "list.pt", [1])), "list.pt is not a sopfast"),
        "state garbled": (
            lambda: load_training_state(_file(tmp / "bad.pt", b"\x00" * 64)),
            "bad.pt is not a readable training state",
        ),
    }


CLEAR = (ValueError, TypeError, FileNotFoundError, ConnectionError)


def test_the_hostile_harness_finds_nothing_silent_and_nothing_generic(tmp_path):
    silent, generic = [], []
    for name, (probe, expected) in _probes(tmp_path).items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = probe()
            except Exception as err:
                if not (isinstance(err, CLEAR) and isinstance(expected, str) and re.search(expected, str(err))):
                    generic.append(f"{name}: {type(err).__name__}: {err}")
                continue
        if isinstance(expected, str) or not expected(result):
            silent.append(name)
        elif "diagnosis" in name and not any("diagnosis.json is damaged" in str(w.message) for w in caught):
            silent.append(f"{name} (no warning)")
    assert not silent and not generic, {"silent": silent, "generic": generic}
