"""``SOP(backbone_dtype=...)``: the frozen backbone held in the compute dtype (issue #29, item 2) — cast once,
trainable parts fp32, outputs as under autocast, checkpoints that load over the backbone as given."""

from __future__ import annotations

import json

import pytest
import torch

import sopfast
from sopfast.model.checkpoint import CONFIG_NAME, hash_backbone
from sopfast.testing import make_bert, make_hf_vit, text_batch

CASES = {
    "vit": (make_hf_vit, lambda: (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)),
    "bert": (make_bert, text_batch),
}


def _models(family: str, **options) -> tuple[sopfast.SOP, sopfast.SOP, tuple]:
    """The same SOP twice (same seed): over the fp32 backbone and with ``backbone_dtype="bfloat16"``."""
    make, batch = CASES[family]
    built = []
    for dtype in (None, "bfloat16"):
        torch.manual_seed(0)
        built.append(sopfast.SOP(make(), num_groups=4, backbone_dtype=dtype, **options))
    return built[0], built[1], batch()


@pytest.mark.parametrize("family", list(CASES))
def test_backbone_in_bf16_trainable_parts_in_fp32_outputs_as_under_autocast(family):
    plain, held, args = _models(family)
    assert {p.dtype for p in held.backbone.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in held.trainable_parameters()} == {torch.float32}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = plain.eval()(*args).logits.float()
        got = held.eval()(*args).logits.float()
    torch.testing.assert_close(got, expected, atol=5e-3, rtol=5e-3)
    held.train()
    labels = torch.zeros(args[0].shape[0], dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = held(*args, labels=labels).loss
    loss.backward()
    grads = [p.grad for p in held.trainable_parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_saved_model_records_the_backbone_as_given_and_loads_over_it(tmp_path):
    torch.manual_seed(0)
    backbone = make_bert()
    given = hash_backbone(backbone)
    model = sopfast.SOP(backbone, num_groups=4, backbone_dtype=torch.bfloat16).eval()
    assert hash_backbone(model.backbone) != given and model.backbone_sha256() == given
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert config["backbone_sha256"] == given and config["config"]["backbone_dtype"] == "bfloat16"
    loaded = sopfast.SOP.from_pretrained(tmp_path, make_bert()).eval()  # the fp32 backbone, strictly checked
    assert {p.dtype for p in loaded.backbone.parameters()} == {torch.bfloat16}
    args = text_batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(*args).logits, model(*args).logits, atol=0, rtol=0)


def test_a_backbone_already_in_the_dtype_is_left_alone():
    model = sopfast.SOP(make_hf_vit(), num_groups=4, backbone_dtype="float32")
    assert model.backbone_sha256() == hash_backbone(model.backbone)
    assert {p.dtype for p in model.backbone.parameters()} == {torch.float32}


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("int8", ValueError, r"backbone_dtype must be one of float32, bfloat16, float16 or None, got 'int8'"),
        (torch.float64, ValueError, r"backbone_dtype must be one of .*got torch.float64"),
        (16, TypeError, r"backbone_dtype must be a torch.dtype or its name .*got int"),
    ],
)
def test_bad_backbone_dtype(value, error, match):
    with pytest.raises(error, match=match):
        sopfast.SOP(make_hf_vit(), num_groups=4, backbone_dtype=value)
