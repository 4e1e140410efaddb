"""save_pretrained / load_pretrained and atomic training-state files."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

import sopfast
from backbones import make_cnn, make_hf_vit
from sopfast import checkpoint
from sopfast.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    atomic_save,
    atomic_write,
    hash_backbone,
    load_pretrained,
    load_training_state,
    save_pretrained,
)


def perturbed(model: sopfast.SOP) -> sopfast.SOP:
    """Move the trainable parts away from their initial values, so a round trip proves something."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    return model.eval()


def same_outputs(a: sopfast.SOP, b: sopfast.SOP, x: torch.Tensor, atol: float = 0.0) -> None:
    """Equal outputs (bitwise with ``atol=0``; a different chunking may round differently)."""
    with torch.no_grad():
        out_a, out_b = a.eval()(x), b.eval()(x)
    torch.testing.assert_close(out_a.logits, out_b.logits, atol=atol, rtol=0)
    assert torch.equal(out_a.group_indices, out_b.group_indices)


def test_round_trip_gives_identical_outputs(tmp_path):
    model = perturbed(sopfast.SOP(make_hf_vit(), num_groups=4, mode="drop"))
    model.tau = 0.25  # changed after construction: the current value is saved
    save_pretrained(model, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {WEIGHTS_NAME, CONFIG_NAME}
    weights = load_file(tmp_path / WEIGHTS_NAME)
    assert weights and not any(k.startswith("backbone.") for k in weights)
    assert any(k.startswith("projection.") for k in weights) and "generator.heads.0" in weights
    meta = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert meta["adapter"] == "HFViTAdapter" and meta["sopfast_version"] == sopfast.__version__
    assert meta["backbone_sha256"] == hash_backbone(model.backbone) and meta["config"]["tau"] == 0.25

    loaded = load_pretrained(tmp_path, make_hf_vit())
    assert (loaded.tau, loaded.mode, loaded.num_groups) == (0.25, "drop", 4)
    same_outputs(model, loaded, torch.randn(2, 3, 32, 32))


def test_round_trip_keeps_adapter_options_and_overrides(tmp_path):
    model = perturbed(sopfast.SOP(make_cnn(), num_groups=3, feature_layer="features"))
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path, make_cnn(), group_batch_size=2)
    assert loaded.config["feature_layer"] == "features" and loaded.group_batch_size == 2
    same_outputs(model, loaded, torch.randn(2, 3, 16, 16), atol=1e-6)


def test_backbone_mismatch(tmp_path):
    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    with pytest.raises(ValueError, match="backbone differs"):
        load_pretrained(tmp_path, make_hf_vit(seed=1))
    with pytest.warns(RuntimeWarning, match="backbone differs"):
        load_pretrained(tmp_path, make_hf_vit(seed=1), strict_backbone=False)


def test_hash_depends_on_weights_only():
    assert hash_backbone(make_hf_vit()) == hash_backbone(make_hf_vit())
    assert hash_backbone(make_hf_vit()) != hash_backbone(make_hf_vit(seed=1))


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=CONFIG_NAME):
        load_pretrained(tmp_path, make_hf_vit())
    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=WEIGHTS_NAME):
        load_pretrained(tmp_path, make_hf_vit())
    with pytest.raises(FileNotFoundError, match="no training state"):
        load_training_state(tmp_path)


def test_atomic_save_round_trip(tmp_path):
    path = atomic_save({"step": 3, "w": torch.arange(4)}, tmp_path / "sub" / "state.pt")
    state = load_training_state(path)
    assert state["step"] == 3 and torch.equal(state["w"], torch.arange(4))


def test_interrupted_replace_keeps_the_old_file(tmp_path, monkeypatch):
    path = atomic_save({"step": 1}, tmp_path / "state.pt")

    def fail(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(checkpoint.os, "replace", fail)
    with pytest.raises(OSError, match="disk gone"):
        atomic_save({"step": 2}, path)
    monkeypatch.undo()
    assert load_training_state(path)["step"] == 1
    assert os.listdir(tmp_path) == ["state.pt"]


def test_interrupted_write_keeps_the_old_file(tmp_path):
    path = atomic_write(tmp_path / "f.bin", lambda f: f.write(b"old"))

    def half_write(f):
        f.write(b"ne")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_write)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]
