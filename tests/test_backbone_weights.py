"""Issue #32: a ``timm:`` / ``torchvision:`` weights file builds its model without the whole constructor
given by hand — what the weights fix is read off them, what they leave open is said with the
``--backbone-option`` to pass — and what does not fit is one line."""

from __future__ import annotations

import logging

import pytest
import torch

import user_data as U
from sopfast.adapters.sources import BackboneSourceError, load_backbone
from sopfast.cli.app import main


def _save(model: torch.nn.Module, path) -> str:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return str(path)


def test_timm_depth_width_patch_image_size_channels_and_classes_come_from_the_weights(tmp_path, caplog):
    import timm

    torch.manual_seed(0)
    shape = {"depth": 3, "embed_dim": 96, "img_size": 32, "patch_size": 8, "in_chans": 1, "num_classes": 3}
    original = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_heads=3, **shape).eval()
    weights = _save(original, tmp_path / "w.safetensors")
    logger = logging.getLogger("sopfast")  # the CLI's handler does not propagate: listen on it directly
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="sopfast"):
            loaded = load_backbone("timm:vit_tiny_patch16_224", weights).model
    finally:
        logger.removeHandler(caplog.handler)
    x = torch.randn(2, 1, 32, 32)
    torch.testing.assert_close(loaded(x), original(x))
    said = caplog.text
    assert "num_classes" not in said and "depth=3" in said and "embed_dim=96" in said
    assert "img_size=32" in said and "patch_size=8" in said
    assert "the weights do not fix num_heads=3" in said and "--backbone-option num_heads=N" in said


def test_what_the_weights_leave_open_is_named_in_a_one_line_error(tmp_path):
    import timm

    built = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, embed_dim=64, num_heads=4, img_size=32)
    weights = _save(built, tmp_path / "w.safetensors")
    with pytest.raises(BackboneSourceError) as err:  # 64 wide: the default 3 heads do not divide it
        load_backbone("timm:vit_tiny_patch16_224", weights)
    text = str(err.value)
    assert "\n" not in text and "embed_dim': 64" in text and "--backbone-option num_heads=N" in text
    built = load_backbone("timm:vit_tiny_patch16_224", weights, options={"num_heads": 4}).model
    assert built.blocks[0].attn.num_heads == 4


def test_weights_of_another_model_are_one_line_with_counts(tmp_path):
    import torchvision

    weights = _save(torchvision.models.resnet18(num_classes=3), tmp_path / "r18.safetensors")
    with pytest.raises(BackboneSourceError) as err:
        load_backbone("torchvision:resnet34", weights)
    text = str(err.value)
    assert "\n" not in text and len(text) < 400
    assert "do not fit torchvision:resnet34: 96 weights missing (layer1.2.conv1.weight" in text
    assert "name the torchvision model the weights are of" in text
    assert load_backbone("torchvision:resnet18", weights).model.fc.out_features == 3  # classes from the head


def test_a_timm_weights_file_trains_on_the_command_line_without_constructor_flags(tmp_path, capsys):
    import timm

    torch.manual_seed(0)
    built = timm.create_model("test_vit", pretrained=False, depth=3, img_size=48, patch_size=8, num_classes=3)
    weights = _save(built, tmp_path / "w.safetensors")
    argv = ["train", "--backbone", "timm:test_vit", "--backbone-weights", weights, "--data"]
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--max-steps", "1", "--batch-size", "4", "--num-groups", "4", "--no-progress"]
    assert main([*argv, str(U.image_folder(tmp_path, size=60)), *flags, "--no-diagnose"]) == 0, capsys.readouterr().err
    import sopfast

    model = sopfast.SOP.from_pretrained(out / "last")  # the record rebuilds it the same way
    assert len(model.backbone.blocks) == 3 and model.adapter.grid == (6, 6)
