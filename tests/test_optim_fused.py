"""AdamW runs fused (``torch.optim.AdamW(fused=True)``) exactly when every trainable parameter is a floating
tensor on a CUDA device (issue #29, item 2); decided without a GPU from the parameters' device and dtype."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import sopfast
from sopfast import devices
from sopfast.testing import make_hf_vit
from sopfast.training import TrainConfig
from sopfast.training.optimizer import build_optimization


def fake(device: str, dtype: torch.dtype = torch.float32) -> SimpleNamespace:
    """A stand-in parameter: :func:`sopfast.devices.fused_adamw` reads only ``device`` and ``dtype``."""
    return SimpleNamespace(device=torch.device(device), dtype=dtype)


@pytest.mark.parametrize(
    ("params", "fused"),
    [
        ([fake("cuda:0"), fake("cuda:1", torch.bfloat16)], True),
        ([fake("cuda:0"), fake("cpu")], False),
        ([fake("cpu")], False),
        ([fake("mps")], False),
        ([fake("cuda:0", torch.int64)], False),
        ([], False),
    ],
)
def test_fused_only_when_every_parameter_is_a_cuda_float(params, fused):
    assert devices.fused_adamw(params) is fused


def test_cpu_training_optimizer_is_not_fused():
    model = sopfast.SOP(make_hf_vit(), num_groups=4)
    optimization = build_optimization(model, TrainConfig(lr=1e-3, warmup_ratio=0.0), total_steps=4)
    assert not optimization.optimizer.defaults["fused"]


def test_adamw_passes_fused_when_the_decision_says_so(monkeypatch):
    """The decision reaches ``torch.optim.AdamW`` (torch's fused AdamW also runs on the CPU, so the
    optimizer builds here)."""
    monkeypatch.setattr(devices, "fused_adamw", lambda _params: True)
    optimizer = devices.adamw([torch.zeros(3, requires_grad=True)], lr=1e-3)
    assert optimizer.defaults["fused"] is True
