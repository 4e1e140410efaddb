"""Adapters by name: ``list_adapters()``, ``SOP(backbone, adapter="hf-deit")``, and a detection that picks
the most specific family, refusing an ambiguous or unknown model with the candidates named — no catch-all
claims a Transformer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sopfast
from sopfast.adapters import CNNAdapter, adapter_class, find_adapter_class, list_adapters, register_adapter
from sopfast.adapters import registry as R
from sopfast.testing import TinyCNN, make_cnn, make_hf, resnet18


def test_builtin_names_cover_every_family():
    assert {"cnn", "torchvision-resnet", "timm-vit", "torchvision-vit", "hf-vit", "hf-bert"} <= set(list_adapters())
    assert len(list_adapters()) == len(set(list_adapters()))


@pytest.mark.parametrize("family", ["hf-deit", "hf-swin", "hf-beit"])
def test_hf_transformers_with_a_conv_stem_are_not_taken_for_cnns(family, monkeypatch):
    backbone = make_hf(family)
    assert find_adapter_class(backbone) is adapter_class(family)
    # without their family, they are refused, not claimed by the CNN adapter (they have attention layers)
    monkeypatch.setattr(R, "_BUILTIN", [e for e in R._BUILTIN if e.name != family])
    with pytest.raises(TypeError, match=r"no sopfast adapter for backbone type .*'cnn'"):
        find_adapter_class(backbone)


def test_a_specific_family_wins_over_the_generic_cnn():
    assert find_adapter_class(resnet18()).__name__ == "TorchvisionResNetAdapter"
    assert find_adapter_class(make_hf("hf-resnet")).__name__ == "HFResNetAdapter"
    assert find_adapter_class(make_cnn()) is CNNAdapter


def test_the_generic_cnn_takes_the_feature_layer_and_the_families_know_theirs():
    model = sopfast.SOP(resnet18(), num_groups=3)  # no feature_layer: the family's layer3
    assert model.adapter.feature_layer == "layer3"
    assert model.adapter.feature_grid(model.prepare(torch.randn(1, 3, 64, 64))) == (4, 4)
    with pytest.raises(ValueError, match="CNN backbones need feature_layer"):
        sopfast.SOP(make_cnn(), num_groups=3)


def test_two_specific_families_that_match_are_refused_as_ambiguous(monkeypatch):
    twin = R.Entry("hf-deit-twin", adapter_class("hf-deit"), lambda m: "DeiTForImageClassification" in R.class_names(m))
    monkeypatch.setattr(R, "_BUILTIN", [*R._BUILTIN, twin])
    with pytest.raises(TypeError, match=r"matches several sopfast adapters \('hf-deit', 'hf-deit-twin'\).*adapter="):
        find_adapter_class(make_hf("hf-deit"))
    assert type(sopfast.SOP(make_hf("hf-deit"), adapter="hf-deit-twin", num_groups=2).adapter).__name__ == (
        "HFDeiTAdapter"
    )


def test_an_unknown_model_is_refused_naming_the_families():
    with pytest.raises(TypeError, match=r"no sopfast adapter for backbone type Linear: supported are .*'hf-roberta'"):
        sopfast.SOP(nn.Linear(3, 2))


def test_a_string_adapter_is_checked_by_name_and_against_the_backbone():
    with pytest.raises(ValueError, match=r"adapter 'hf-nope' is not a sopfast adapter; allowed: .*hf-deit"):
        sopfast.SOP(make_hf("hf-deit"), adapter="hf-nope")
    with pytest.raises(ValueError, match=r"adapter='hf-roberta' .* cannot run backbone DeiT.*that match it: hf-deit"):
        sopfast.SOP(make_hf("hf-deit"), adapter="hf-roberta")
    with pytest.raises(TypeError, match="adapter must be a BackboneAdapter, the name of one"):
        sopfast.SOP(make_hf("hf-deit"), adapter=CNNAdapter)


def test_a_model_chosen_by_name_reloads_with_it(tmp_path):
    """A CNN with an attention block is no generic CNN by detection; ``adapter="cnn"`` runs it, and the
    saved model remembers the name."""

    class AttentionCNN(TinyCNN):
        def __init__(self):
            super().__init__()
            self.attention = nn.MultiheadAttention(16, 2)

    torch.manual_seed(0)
    backbone = AttentionCNN().eval()
    with pytest.raises(TypeError, match="no sopfast adapter"):
        sopfast.SOP(backbone)
    model = sopfast.SOP(backbone, adapter="cnn", feature_layer="features", num_groups=3)
    model.save_pretrained(tmp_path)
    loaded = sopfast.SOP.from_pretrained(tmp_path, backbone)
    assert type(loaded.adapter) is CNNAdapter and loaded.config["adapter"] == "cnn"


def test_registered_adapters_have_names_and_come_first(monkeypatch):
    monkeypatch.setattr(R, "_REGISTERED", [])

    class Mine(CNNAdapter):
        family = "my CNN"

    register_adapter(lambda m: isinstance(m, TinyCNN), Mine, name="my-cnn")
    assert list_adapters()[0] == "my-cnn" and find_adapter_class(make_cnn()) is Mine
    assert type(sopfast.SOP(make_cnn(), adapter="my-cnn", feature_layer="features").adapter) is Mine
    register_adapter(lambda m: False, Mine, name="my-cnn")  # registered again (a notebook cell re-run): replaced
    assert list_adapters().count("my-cnn") == 1 and find_adapter_class(make_cnn()) is CNNAdapter
    with pytest.raises(ValueError, match="'hf-vit' is the name of a built-in adapter"):
        register_adapter(lambda m: False, Mine, name="hf-vit")


def test_contributing_shows_whole_families_of_at_most_30_lines():
    """docs/contributing.md's family examples are the code itself (ERNIE: its whole file), each ≤ 30 lines."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "contributing.md").read_text(encoding="utf-8")
    start = text.index("## A new backbone family")
    section = text[start : text.index("\n## ", start)]
    blocks = section.split("```python\n")[1:]
    assert len(blocks) == 2
    for block, source in zip(blocks, ("hf_ernie.py", "hf_vit.py")):
        code = block[: block.index("```")]
        assert len(code.strip().splitlines()) <= 30
        assert code in (root / "python" / "sopfast" / "adapters" / source).read_text(encoding="utf-8")
