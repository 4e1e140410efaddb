"""``SOP(compile=...)``: ``torch.compile`` of the backbone's and the projection's blocks (issue #29, item 2).
Dynamo captures them here with the ``eager`` backend (inductor takes tens of seconds on this CPU), so the
test checks the capture and that it changes no result; speed lives in ``bench/gpu_script.py``."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.model import runtime
from sopfast.testing import make_bert, make_cnn, make_hf_vit, make_timm_vit, text_batch


def _images() -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def _torchvision_vit():
    from torchvision.models import VisionTransformer

    return VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=3).eval()


CASES = {
    "vit": (make_hf_vit, _images),
    "bert": (make_bert, text_batch),
    "timm": (make_timm_vit, _images),
    "torchvision": (_torchvision_vit, _images),
}


@pytest.fixture
def eager_backend(monkeypatch):
    monkeypatch.setitem(runtime.COMPILE_OPTIONS, "backend", "eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(model: sopfast.SOP) -> list[bool]:
    """Per compile unit, whether ``nn.Module.compile`` wrapped its call."""
    return [u._compiled_call_impl is not None for u in model.adapter.compile_units(model.projection)]


@pytest.mark.parametrize("mode", ["exact", "drop"])
@pytest.mark.parametrize("family", list(CASES))
def test_compiled_blocks_give_the_eager_logits(family, mode, eager_backend):
    make, batch = CASES[family]
    torch.manual_seed(0)
    model = sopfast.SOP(make(), num_groups=4, compile=True).eval()
    args = batch()
    torch.manual_seed(0)
    eager = sopfast.SOP(make(), num_groups=4).eval()
    assert not any(_compiled(model))
    with torch.no_grad():
        got, expected = model(*args, mode=mode).logits, eager(*args, mode=mode).logits
    assert _compiled(model) and all(_compiled(model)) and not any(_compiled(eager))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_auto_compiles_on_cuda_only():
    assert runtime.compiles_on("auto", torch.device("cuda", 0))
    assert not runtime.compiles_on("auto", torch.device("cpu"))
    assert runtime.compiles_on(True, torch.device("cpu")) and not runtime.compiles_on(False, torch.device("cuda"))
    model = sopfast.SOP(make_hf_vit(), num_groups=4, compile="auto").eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert not any(_compiled(model))
    assert model.config["compile"] == "auto"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_compile_values_are_refused(value):
    with pytest.raises(ValueError, match=r"compile must be one of \(False, True, 'auto'\), got"):
        sopfast.SOP(make_hf_vit(), num_groups=4, compile=value)


def test_compile_needs_blocks_to_compile():
    with pytest.raises(ValueError, match="compile=True: CNNAdapter names no blocks to compile; use False"):
        sopfast.SOP(make_cnn(), num_groups=4, feature_layer="features", compile=True)
    assert sopfast.SOP(make_cnn(), num_groups=4, feature_layer="features", compile="auto").compile_option == "auto"


def test_a_compiled_training_step_gives_the_eager_gradients(eager_backend):
    """The projection's compiled blocks run under activation checkpointing in training."""
    models = []
    for compile in (True, False):
        torch.manual_seed(0)
        model = sopfast.SOP(make_bert(), num_groups=4, compile=compile).train()
        model(*text_batch(), labels=torch.tensor([0, 1, 0])).loss.backward()
        models.append(model)
    assert all(_compiled(models[0]))
    for got, expected in zip(models[0].trainable_parameters(), models[1].trainable_parameters()):
        assert (got.grad is None) == (expected.grad is None)
        if got.grad is not None:
            torch.testing.assert_close(got.grad, expected.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("word", "value"), [("yes", True), ("no", False), ("auto", "auto"), ("True", True)])
def test_the_command_line_takes_yes_no_or_auto(word, value):
    from sopfast.cli import build_parser

    parser = build_parser().subcommands["train"]
    compile_flag = next(a for a in parser._actions if a.dest == "compile")
    assert compile_flag.type(word) == value
