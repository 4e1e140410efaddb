"""The torchvision ViT adapter (``sopfast/adapters/torchvision_vit.py``), added as one file: found by
type, exact equals the reference (tests/test_exact_vs_reference.py), drop and training run, the
command line loads it from ``torchvision:vit_b_16`` weights and from a pickled module."""

from __future__ import annotations

import pytest
import torch
from torchvision.models import VisionTransformer

import sopfast
from sopfast.adapters.torchvision_vit import TorchvisionViTAdapter
from sopfast.cli import main


def tiny_vit(image_size: int = 32) -> VisionTransformer:
    torch.manual_seed(0)
    vit = VisionTransformer(image_size, 8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=3)
    torch.nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zero: all logits 0
    return vit.eval()


def test_found_by_type_and_equal_to_the_plain_model():
    vit = tiny_vit()
    model = sopfast.SOP(vit, num_groups=4, tau=0.25)
    assert isinstance(model.adapter, TorchvisionViTAdapter) and model.adapter.grid == (4, 4)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.adapter.full_forward(model.prepare(x))[0], vit(x))


def test_drop_mode_runs_and_trains():
    model = sopfast.SOP(tiny_vit(), num_groups=4, tau=0.25, mode="drop")
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    out = model(x)
    out.loss(y).backward()
    assert out.logits.shape == (4, 3) and model.generator.heads[0].grad is not None


def test_unsupported_head_is_refused():
    vit = VisionTransformer(32, 8, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64, representation_size=16)
    with pytest.raises(ValueError, match="representation_size"):
        sopfast.SOP(vit)


def test_cli_trains_a_pickled_torchvision_vit(tmp_path):
    import user_data as U

    torch.save(tiny_vit(), tmp_path / "vit.pt")
    data = str(U.image_folder(tmp_path, per_class=3, size=32))
    args = ["train", "--backbone", str(tmp_path / "vit.pt"), "--trust-pickle", "--data", data, "--holdout", "0.5"]
    run = [
        "--num-groups",
        "3",
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "r"),
    ]
    assert main([*args, *run]) == 0
    assert (tmp_path / "r" / "last" / "sop_model.safetensors").is_file()


def test_weights_fix_the_image_size_of_vit_b_16(tmp_path):
    """``torchvision:vit_b_16`` weights made for 32-pixel images load at 32 pixels (read off the table)."""
    from torchvision.models import vit_b_16

    torch.manual_seed(0)
    weights = tmp_path / "vit.pth"
    torch.save(vit_b_16(image_size=32, num_classes=3).state_dict(), weights)
    backbone = sopfast.adapters.load_backbone("torchvision:vit_b_16", weights)
    assert backbone.model.image_size == 32 and backbone.model.heads.head.out_features == 3
