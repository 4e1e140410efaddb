"""save_pretrained / SOP.from_pretrained and atomic training-state files."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

import sopfast
from sopfast.model import checkpoint
from sopfast.model.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    atomic_save,
    atomic_write,
    hash_backbone,
    load_training_state,
    save_pretrained,
)
from sopfast.testing import make_cnn, make_hf_vit


def perturbed(model: sopfast.SOP) -> sopfast.SOP:
    """Move the trainable parts away from their initial values, so a round trip proves something."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    return model.eval()


def as_written_by(directory, version: str = "0.3.0") -> dict:
    """Make the checkpoint in ``directory`` look as sopfast ``version`` wrote it: no checksums, no dtype
    and shape record (0.3.0 and older); returns its config for further edits."""
    meta = json.loads((directory / CONFIG_NAME).read_text())
    for key in ("sha256", "weights"):
        meta.pop(key)
    meta["sopfast_version"] = version
    (directory / CONFIG_NAME).write_text(json.dumps(meta))
    return meta


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

    loaded = sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
    assert (loaded.tau, loaded.mode, loaded.num_groups) == (0.25, "drop", 4)
    same_outputs(model, loaded, torch.randn(2, 3, 32, 32))


def test_round_trip_keeps_adapter_options_and_overrides(tmp_path):
    model = perturbed(sopfast.SOP(make_cnn(), num_groups=3, feature_layer="features"))
    save_pretrained(model, tmp_path)
    loaded = sopfast.SOP.from_pretrained(tmp_path, make_cnn(), group_batch_size=2)
    assert loaded.config["feature_layer"] == "features" and loaded.group_batch_size == 2
    same_outputs(model, loaded, torch.randn(2, 3, 16, 16), atol=1e-6)


def test_backbone_mismatch(tmp_path):
    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    with pytest.raises(ValueError, match="backbone differs"):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit(seed=1))
    with pytest.warns(RuntimeWarning, match="backbone differs"):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit(seed=1), strict_backbone=False)


def test_hash_depends_on_weights_only():
    assert hash_backbone(make_hf_vit()) == hash_backbone(make_hf_vit())
    assert hash_backbone(make_hf_vit()) != hash_backbone(make_hf_vit(seed=1))


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=CONFIG_NAME):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=WEIGHTS_NAME):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
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


def test_backbone_keys_in_the_weights_file_are_refused(tmp_path):
    """A ``backbone.*`` entry must never be written into the caller's frozen backbone."""
    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    as_written_by(tmp_path)  # a file without checksums: the checks of its contents still apply
    weights = load_file(tmp_path / WEIGHTS_NAME)
    weights["backbone.classifier.bias"] = torch.full((3,), 100.0)
    from safetensors.torch import save_file

    save_file(weights, tmp_path / WEIGHTS_NAME)
    backbone = make_hf_vit()
    with pytest.raises(ValueError, match=r"unexpected \['backbone.classifier.bias'\]"):
        sopfast.SOP.from_pretrained(tmp_path, backbone)
    assert torch.equal(backbone.classifier.bias, make_hf_vit().classifier.bias)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, value):
    from safetensors.torch import save_file

    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    as_written_by(tmp_path)
    weights = load_file(tmp_path / WEIGHTS_NAME)
    weights["generator.heads.0"][3, 1] = value
    save_file(weights, tmp_path / WEIGHTS_NAME)
    with pytest.raises(ValueError, match=r"NaN or infinite weights in \['generator.heads.0'\]"):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())


def _vit_with(**changes):
    """make_hf_vit's weights under another config (same shapes)."""
    from transformers import ViTConfig, ViTForImageClassification

    base = make_hf_vit()
    config = ViTConfig(**{**base.config.to_dict(), **changes})
    other = ViTForImageClassification(config).eval()
    other.load_state_dict(base.state_dict())
    return other


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"num_attention_heads": 4}, "num_attention_heads: 2 → 4"),
        ({"layer_norm_eps": 1e-3}, "layer_norm_eps"),
        ({"hidden_act": "relu"}, "hidden_act: 'gelu' → 'relu'"),
    ],
)
def test_same_weights_under_another_architecture_are_refused(tmp_path, changes, match):
    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    other = _vit_with(**changes)
    assert hash_backbone(other) == hash_backbone(make_hf_vit())
    with pytest.raises(ValueError, match=f"same weights, another architecture .*{match}"):
        sopfast.SOP.from_pretrained(tmp_path, other)
    sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())  # the saved backbone itself still loads


def test_corrupt_files_name_the_file(tmp_path):
    save_pretrained(sopfast.SOP(make_hf_vit(), num_groups=4), tmp_path)
    as_written_by(tmp_path)
    weights = (tmp_path / WEIGHTS_NAME).read_bytes()
    (tmp_path / WEIGHTS_NAME).write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match=f"{WEIGHTS_NAME} is not a readable safetensors file"):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
    config = tmp_path / CONFIG_NAME
    meta = json.loads(config.read_text())
    config.write_text(json.dumps({k: v for k, v in meta.items() if k != "backbone_sha256"}))
    with pytest.raises(ValueError, match=rf"{CONFIG_NAME} is not a valid SOP config: it lacks \['backbone_sha256'\]"):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
    config.write_text("{not json")
    with pytest.raises(ValueError, match=rf"{CONFIG_NAME} is not a valid SOP config \(JSON"):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
    state = atomic_save({"step": 1, "w": torch.arange(1000)}, tmp_path / "state.pt")
    state.write_bytes(state.read_bytes()[:300])
    with pytest.raises(ValueError, match=r"state\.pt is not a readable training state"):
        load_training_state(state)


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path):
    dead = tmp_path / f".{checkpoint.STATE_NAME}.999999999.0123abcd.tmp"
    live = tmp_path / "best" / f".{WEIGHTS_NAME}.{os.getpid()}.0123abcd.tmp"
    live.parent.mkdir()
    dead.write_bytes(b"x" * 100)
    live.write_bytes(b"y")
    assert checkpoint.remove_stale_temp_files(tmp_path) == [dead]
    assert not dead.exists() and live.exists()


def test_checkpoints_of_sopfast_0_1_load_with_their_tie_rule(tmp_path):
    """0.1 kept one ``generator.weight [3E, E]`` and ranked ties by the logits; no architecture entry."""
    from safetensors.torch import save_file

    model = perturbed(sopfast.SOP(make_hf_vit(), num_groups=4, ties="logits"))
    save_pretrained(model, tmp_path)
    weights = load_file(tmp_path / WEIGHTS_NAME)
    weights["generator.weight"] = weights.pop("generator.heads.0")
    save_file(weights, tmp_path / WEIGHTS_NAME)
    meta = as_written_by(tmp_path, "0.1.0")
    del meta["config"]["ties"], meta["backbone_architecture"], meta["config"]["checkpoint_projection"]
    (tmp_path / CONFIG_NAME).write_text(json.dumps(meta))
    loaded = sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
    assert loaded.generator.ties == "logits"
    same_outputs(model, loaded, torch.randn(2, 3, 32, 32))

    meta["config"]["num_heads"] = 2
    (tmp_path / CONFIG_NAME).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="splits one generator weight into E/H-wide heads"):
        sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())


def test_checkpoints_of_late_0_1_builds_with_stacked_full_width_heads_load(tmp_path):
    """Late 0.1 builds saved ``ties`` and the ``H`` full-width heads as one ``generator.weight [H, 3E, E]``."""
    from safetensors.torch import save_file

    model = perturbed(sopfast.SOP(make_hf_vit(), num_groups=4, num_heads=2))
    save_pretrained(model, tmp_path)
    weights = load_file(tmp_path / WEIGHTS_NAME)
    weights["generator.weight"] = torch.stack([weights.pop("generator.heads.0"), weights.pop("generator.heads.1")])
    save_file(weights, tmp_path / WEIGHTS_NAME)
    meta = as_written_by(tmp_path, "0.1.0")
    del meta["backbone_architecture"], meta["config"]["checkpoint_projection"]
    (tmp_path / CONFIG_NAME).write_text(json.dumps(meta))
    loaded = sopfast.SOP.from_pretrained(tmp_path, make_hf_vit())
    assert loaded.generator.ties == "authors" and len(loaded.generator.heads) == 2
    for h in range(2):
        torch.testing.assert_close(loaded.generator.heads[h], model.generator.heads[h], rtol=0, atol=0)
    same_outputs(model, loaded, torch.randn(2, 3, 32, 32))
