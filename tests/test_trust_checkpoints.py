"""Checkpoints that prove themselves (issue #31): SHA-256 of the weights file, the config and the
training state, recorded at save and verified at load; dtypes and shapes; every config entry; the
version; no NaN weights written; checkpoints of 0.3.0 (no checksums) still load."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

import sopfast
from sopfast.model.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    _config_sha256,
    atomic_save,
    load_training_state,
    save_pretrained,
    save_training_state,
)
from sopfast.model.config_entries import LATER_OPTIONS, REQUIRED_OPTIONS
from sopfast.model.sop import SOP
from sopfast.testing import make_hf_vit

X = torch.randn(2, 3, 32, 32)


def saved(tmp_path, **options) -> SOP:
    model = SOP(make_hf_vit(), num_groups=4, tau=0.25, ties="authors", **options).eval()
    with torch.no_grad():
        model.generator.heads[0].add_(0.01)
    save_pretrained(model, tmp_path)
    return model


def config(tmp_path) -> dict:
    return json.loads((tmp_path / CONFIG_NAME).read_text())


def write_config(tmp_path, meta: dict) -> None:
    (tmp_path / CONFIG_NAME).write_text(json.dumps(meta))


def as_0_3_0(tmp_path) -> dict:
    """The config as sopfast 0.3.0 wrote it: no checksums, no dtype/shape record."""
    meta = config(tmp_path)
    del meta["sha256"], meta["weights"]
    meta["sopfast_version"] = "0.3.0"
    write_config(tmp_path, meta)
    return meta


def resealed(meta: dict) -> dict:
    """``meta`` with its own SHA-256 recomputed (as if the edit had been saved)."""
    meta["sha256"][CONFIG_NAME] = _config_sha256(meta)
    return meta


def flip_byte(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_config_records_the_checksums_dtypes_and_shapes(tmp_path):
    saved(tmp_path)
    meta = config(tmp_path)
    assert set(meta["sha256"]) == {WEIGHTS_NAME, CONFIG_NAME}
    assert meta["weights"]["generator.heads.0"] == ["float32", [96, 32]]
    assert set(REQUIRED_OPTIONS) | set(LATER_OPTIONS) <= set(meta["config"])


def test_required_options_are_every_constructor_option():
    from sopfast.cli.options import parameters

    assert set(REQUIRED_OPTIONS) | set(LATER_OPTIONS) == set(parameters(SOP)) - {"class_weights", "adapter"}


@pytest.mark.parametrize("where", ["generator", "selector", "projection"])
def test_a_flipped_byte_in_the_weights_names_the_file(tmp_path, where):
    model = saved(tmp_path)
    weights = load_file(tmp_path / WEIGHTS_NAME)
    name = next(k for k in weights if k.startswith(where))
    data = (tmp_path / WEIGHTS_NAME).read_bytes()
    offset = data.index(weights[name].numpy().tobytes()[:16]) + 5
    flip_byte(tmp_path / WEIGHTS_NAME, offset)
    with pytest.raises(ValueError, match=f"{WEIGHTS_NAME} does not match the SHA-256 recorded in {CONFIG_NAME}"):
        SOP.from_pretrained(tmp_path, model.backbone)


def test_an_edited_config_is_refused(tmp_path):
    model = saved(tmp_path)
    original = config(tmp_path)
    edited = json.loads(json.dumps(original))
    edited["config"]["tau"] = 0.35
    write_config(tmp_path, edited)
    with pytest.raises(ValueError, match=f"{CONFIG_NAME} does not match its recorded SHA-256.*tau=0.1"):
        SOP.from_pretrained(tmp_path, model.backbone)
    write_config(tmp_path, original)  # what the message advises instead
    assert SOP.from_pretrained(tmp_path, model.backbone, tau=0.35).tau == 0.35


@pytest.mark.parametrize("key", ["num_groups", "tau", "ties", "saliency_levels"])
def test_a_missing_config_entry_is_an_error_naming_it_and_the_file(tmp_path, key):
    model = saved(tmp_path)
    meta = as_0_3_0(tmp_path)
    del meta["config"][key]
    write_config(tmp_path, meta)
    with pytest.raises(ValueError, match=rf"{CONFIG_NAME} lacks the config entries \['{key}'\]"):
        SOP.from_pretrained(tmp_path, model.backbone)


def test_a_float_stored_as_integers_is_refused(tmp_path):
    model = saved(tmp_path)
    meta = config(tmp_path)
    del meta["sha256"]  # a file without checksums (only sopfast 0.3.0 wrote them so): its recorded dtypes apply
    meta["sopfast_version"] = "0.3.0"
    write_config(tmp_path, meta)
    weights = load_file(tmp_path / WEIGHTS_NAME)
    weights["generator.heads.0"] = weights["generator.heads.0"].long()
    save_file(weights, tmp_path / WEIGHTS_NAME)
    with pytest.raises(ValueError, match=r"dtypes and shapes recorded .*generator.heads.0 is \['int64'"):
        SOP.from_pretrained(tmp_path, model.backbone)
    del meta["weights"]  # nor a record (0.3.0): the model's own dtypes decide
    write_config(tmp_path, meta)
    with pytest.raises(ValueError, match=r"dtypes differ for \['generator.heads.0 torch.int64 for torch.float32'\]"):
        SOP.from_pretrained(tmp_path, model.backbone)


@pytest.mark.parametrize(
    "version, match",
    [
        ("99.0", r"saved by sopfast 99.0, newer than the installed .*upgrade"),
        ("0.99.0", r"saved by sopfast 0.99.0, newer"),
        ("garbage", r"sopfast_version 'garbage' is not a version number"),
        (3, r"sopfast_version 3 is not a version number"),
    ],
)
def test_the_version_is_read_and_checked(tmp_path, version, match):
    model = saved(tmp_path)
    meta = as_0_3_0(tmp_path)
    meta["sopfast_version"] = version
    write_config(tmp_path, meta)
    with pytest.raises(ValueError, match=match):
        SOP.from_pretrained(tmp_path, model.backbone)


def test_a_newer_patch_version_loads(tmp_path):
    model = saved(tmp_path)
    meta = config(tmp_path)
    major, minor, patch = map(int, sopfast.__version__.split(".")[:3])
    meta["sopfast_version"] = f"{major}.{minor}.{patch + 1}"
    write_config(tmp_path, resealed(meta))
    loaded = SOP.from_pretrained(tmp_path, model.backbone).eval()
    with torch.no_grad():
        assert torch.equal(loaded(X).logits, model.eval()(X).logits)


def test_checkpoints_of_0_3_0_without_checksums_load(tmp_path):
    model = saved(tmp_path)
    as_0_3_0(tmp_path)
    loaded = SOP.from_pretrained(tmp_path, model.backbone).eval()
    with torch.no_grad():
        assert torch.equal(loaded(X).logits, model(X).logits)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_weights_are_refused_at_save(tmp_path, value):
    model = SOP(make_hf_vit(), num_groups=4)
    with torch.no_grad():
        model.selector.class_queries[0, 0] = value
    with pytest.raises(ValueError, match=r"refusing to save .*NaN or infinite weights in \['selector.class_queries'\]"):
        model.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_changed_training_state_names_the_file(tmp_path):
    state = {"step": 3, "w": torch.arange(8, dtype=torch.float32), "nested": {"lr": 0.1, "ids": [1, 2]}}
    path = save_training_state(state, tmp_path / "state.pt")
    loaded = load_training_state(path)
    assert loaded["step"] == 3 and loaded["sopfast_version"] == sopfast.__version__
    data = path.read_bytes()
    offset = data.index(torch.arange(8, dtype=torch.float32).numpy().tobytes()) + 9
    flip_byte(path, offset)  # one bit of w[2]: the zip still reads
    with pytest.raises(ValueError, match=r"state\.pt does not match its recorded SHA-256"):
        load_training_state(path)
    loaded["nested"]["lr"] = 0.2
    atomic_save(loaded, path)  # a value changed, the old checksum kept
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):
        load_training_state(path)


def test_a_training_state_of_a_newer_sopfast_is_refused(tmp_path):
    path = atomic_save({"step": 1, "sopfast_version": "99.1.0"}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match="newer than the installed"):
        load_training_state(path)
