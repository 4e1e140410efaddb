"""Adapters prove themselves (``sopfast.adapters.check``, issue #45): every registered family passes; an
adapter that drops MPNet's relative position bias from its layer walk, one that claims ``drop`` computes
the backbone's function where it does not, and one whose embedding is off are flagged, refused at
registration, and the explainers run ``exact`` for them."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from test_exact_vs_reference import FAMILIES

import sopfast
from sopfast.adapters import (
    AdapterCheckError,
    HFBeitAdapter,
    HFTextFamily,
    HFViTAdapter,
    HFViTFamily,
    check,
    get_adapter,
    hf_classifier,
    register_adapter,
)
from sopfast.adapters import base as adapter_base
from sopfast.adapters import registry as R
from sopfast.masking import MaskedForward, UnfaithfulModeWarning
from sopfast.testing import TINY_HF, make_hf_vit, resnet18, text_batch

CASES = {**FAMILIES, "torchvision-resnet": (resnet18, {}, lambda: (torch.randn(2, 3, 64, 64),))}
TEXT = ("input_ids", "attention_mask", "token_type_ids")


@pytest.fixture(autouse=True)
def _fresh_measurements(monkeypatch):
    """Each test measures afresh and registers nothing for the others."""
    saved = dict(adapter_base.MEASURED_EXACT_MODES)
    adapter_base.MEASURED_EXACT_MODES.clear()
    monkeypatch.setattr(R, "_REGISTERED", list(R._REGISTERED))
    yield
    adapter_base.MEASURED_EXACT_MODES.clear()
    adapter_base.MEASURED_EXACT_MODES.update(saved)


def example(args: tuple) -> object:
    return args[0] if len(args) == 1 else dict(zip(TEXT, args))


@pytest.mark.parametrize("family", list(CASES))
def test_every_registered_family_passes(family):
    factory, options, inputs = CASES[family]
    torch.manual_seed(0)
    adapter = get_adapter(factory(), **options)
    report = check(adapter, example(inputs()))
    assert report.ok, str(report)
    assert report.exact_modes == adapter.exact_modes and report.faithful_mode == adapter.faithful_mode
    names = [f.name for f in report.findings]
    assert names[:5] == ["full forward", "classifier", "features", "embedding", "exact groups"]
    assert ("drop = exact" in names) == ("drop" in adapter.exact_modes)


def test_the_cases_cover_every_builtin_family():
    covered = set()
    for factory, options, _ in CASES.values():
        torch.manual_seed(0)
        covered.add(type(get_adapter(factory(), **options)))
    assert covered == set(R.builtin_adapter_classes())


# -- deliberately wrong adapters ------------------------------------------------------------------------
def tiny_mpnet() -> torch.nn.Module:
    config = transformers.MPNetConfig(
        **{k: TINY_HF["hf-bert"][2][k] for k in ("vocab_size", "hidden_size", "num_hidden_layers")},
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=66,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    torch.manual_seed(0)
    return transformers.MPNetForSequenceClassification(config).eval()


class NaiveMPNetAdapter(HFTextFamily):
    """MPNet on the text base as if it were RoBERTa: its layer walk leaves out the relative position bias the
    encoder gives every layer, and it keeps the base's claim that ``drop`` is exact."""

    base_model = "mpnet"
    token_types = False

    def position_offset(self) -> int:
        return self.pad + 1

    def head(self, out):
        return self.backbone.classifier(out.last_hidden_state)

    def classifier_weight(self) -> torch.Tensor:
        return self.backbone.classifier.out_proj.weight


class MPNetAdapter(NaiveMPNetAdapter):
    """The fix: the embedding stops the encoder's own forward (bias included); drop is not claimed exact."""

    supports_checkpointing = False
    exact_modes = ("exact",)


class ClaimsDropViT(HFViTAdapter):
    """A ViT adapter claiming its ``drop`` computes the backbone's function (it does not)."""

    exact_modes = ("exact", "drop")


class OffEmbeddingViT(HFViTAdapter):
    """A ViT adapter whose generator embedding is off by 1e-3."""

    def embed(self, projection, inputs):
        return super().embed(projection, inputs) + 1e-3


def text_example() -> dict:
    ids, mask, _ = text_batch(pairs=False)
    return {"input_ids": ids, "attention_mask": mask}


def failed(report) -> list[str]:
    return [f.name for f in report.failed()]


def test_an_mpnet_adapter_that_drops_the_position_bias_is_flagged():
    report = check(NaiveMPNetAdapter(tiny_mpnet()), text_example())
    assert not report.ok and failed(report) == ["embedding", "drop = exact"], str(report)
    assert report.faithful_mode == "exact" and "FAILED (embedding, drop = exact)" in str(report)
    assert adapter_base.MEASURED_EXACT_MODES[NaiveMPNetAdapter] == ("exact",)
    assert NaiveMPNetAdapter(tiny_mpnet()).faithful_mode == "exact"  # the explainers follow the measurement
    fixed = check(MPNetAdapter(tiny_mpnet()), text_example())
    assert fixed.ok and fixed.faithful_mode == "exact", str(fixed)


def test_a_false_drop_claim_and_an_off_embedding_are_flagged():
    x = torch.randn(2, 3, 32, 32)
    claims = check(ClaimsDropViT(make_hf_vit()), x)
    assert failed(claims) == ["drop = exact"] and claims.exact_modes == ("exact",)
    assert failed(check(OffEmbeddingViT(make_hf_vit()), x)) == ["embedding"]
    assert check(HFViTAdapter(make_hf_vit()), x).ok


def test_the_explainers_measure_a_drop_claim_at_first_use_and_run_exact():
    x = torch.randn(2, 3, 32, 32)
    adapter = ClaimsDropViT(make_hf_vit())
    assert adapter.faithful_mode == "drop"  # as claimed, before anything is measured
    with pytest.warns(UnfaithfulModeWarning, match=r"ClaimsDropViT: drop's group logits vs exact's .* the faithful"):
        assert MaskedForward(adapter, x).mode == "exact"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # measured once per class: no second measurement, no second warning
        assert MaskedForward(ClaimsDropViT(make_hf_vit()), x).mode == "exact"
    with pytest.warns(UnfaithfulModeWarning, match="mode='drop' on ClaimsDropViT runs a different function"):
        MaskedForward(adapter, x, mode="drop")


def test_the_builtin_families_are_trusted_without_a_measurement():
    ids, mask, _ = text_batch()
    assert MaskedForward(sopfast.testing.make_bert(), {"input_ids": ids, "attention_mask": mask}).mode == "drop"
    assert not adapter_base.MEASURED_EXACT_MODES


def test_registering_with_an_example_refuses_a_wrong_adapter_and_warns_of_a_false_claim():
    mpnet, matcher = tiny_mpnet(), hf_classifier("MPNetForSequenceClassification")
    with pytest.raises(AdapterCheckError, match=r"(?s)NaiveMPNetAdapter is not registered:\n.*FAIL  embedding"):
        register_adapter(matcher, NaiveMPNetAdapter, "mpnet", check_with=(mpnet, text_example()))
    assert "mpnet" not in sopfast.adapters.list_adapters()
    register_adapter(matcher, MPNetAdapter, "mpnet", check_with=(mpnet, text_example()))
    assert type(sopfast.SOP(mpnet, num_groups=3).adapter) is MPNetAdapter
    with pytest.warns(UserWarning, match="ClaimsDropViT: drop's group logits vs exact's"):
        vit = hf_classifier("ViTForImageClassification")
        register_adapter(vit, ClaimsDropViT, "claims", check_with=(make_hf_vit(), torch.randn(1, 3, 32, 32)))
    assert "claims" in sopfast.adapters.list_adapters() and ClaimsDropViT(make_hf_vit()).faithful_mode == "exact"
    with pytest.raises(ValueError, match="does not match"):
        register_adapter(matcher, MPNetAdapter, "mpnet", check_with=(make_hf_vit(), torch.randn(1, 3, 32, 32)))
    with pytest.raises(TypeError, match=r"check_with must be a pair \(backbone, example\)"):
        register_adapter(matcher, MPNetAdapter, "mpnet", check_with=mpnet)


def test_an_adapter_that_raises_is_reported_not_crashed():
    class Broken(HFViTAdapter):
        def embed(self, projection, inputs):
            raise RuntimeError("no embedding here")

    report = check(Broken(make_hf_vit()), torch.randn(1, 3, 32, 32))
    assert failed(report) == ["embedding"] and "RuntimeError: no embedding here" in str(report)


# -- the public bases -----------------------------------------------------------------------------------
def test_a_beit_like_family_is_the_beit_base_with_another_base_model():
    config = transformers.Data2VecVisionConfig(**TINY_HF["hf-beit"][2], num_labels=3)
    torch.manual_seed(0)
    backbone = transformers.Data2VecVisionForImageClassification(config).eval()

    class Data2VecVisionAdapter(HFBeitAdapter):
        family = "Hugging Face Data2VecVisionForImageClassification"
        base_model = "data2vec_vision"

    assert check(Data2VecVisionAdapter(backbone), torch.randn(2, 3, 32, 32)).ok


def test_a_vit_like_family_is_a_subclass_of_the_public_base():
    config = transformers.ViTMSNConfig(**TINY_HF["hf-vit"][2], num_labels=3)
    backbone = transformers.ViTMSNForImageClassification(config).eval()

    class ViTMSNAdapter(HFViTFamily):
        family = "Hugging Face ViTMSNForImageClassification"

    report = check(ViTMSNAdapter(backbone), torch.randn(2, 3, 32, 32))
    assert report.ok and report.faithful_mode == "exact", str(report)


# -- the command line -----------------------------------------------------------------------------------
ADAPTERS_MODULE = """
import sopfast
from sopfast.adapters import HFTextFamily, hf_classifier, register_adapter


class MPNet(HFTextFamily):
    base_model = "mpnet"
    token_types = False
    supports_checkpointing = {naive}  # True: the layer walk, without the relative position bias
    exact_modes = ("exact", "drop") if {naive} else ("exact",)

    def position_offset(self):
        return self.pad + 1

    def head(self, out):
        return self.backbone.classifier(out.last_hidden_state)

    def classifier_weight(self):
        return self.backbone.classifier.out_proj.weight


register_adapter(hf_classifier("MPNetForSequenceClassification"), MPNet, "my-mpnet")
"""


@pytest.mark.parametrize("fixed", [False, True])
def test_check_adapter_checks_the_adapter_a_module_registers(tmp_path, monkeypatch, capsys, fixed):
    import sys

    from sopfast.cli.app import main

    tiny_mpnet().save_pretrained(tmp_path / "mpnet")
    name = f"my_adapters_{fixed}"
    (tmp_path / f"{name}.py").write_text(ADAPTERS_MODULE.format(naive=not fixed))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    status = main(["check-adapter", "--backbone", str(tmp_path / "mpnet"), "--import", name, "--adapter", "my-mpnet"])
    printed = capsys.readouterr().out
    assert "sopfast adapter check: MPNet on 2 example(s)" in printed
    if fixed:
        assert status == 0 and "passed; the explainers' faithful mode: 'exact'" in printed, printed
    else:
        assert status == 1 and "FAIL  embedding" in printed and "FAIL  drop = exact" in printed, printed
    sys.modules.pop(name, None)


def test_check_adapter_passes_a_builtin_family_and_names_a_missing_module(tmp_path, capsys):
    from sopfast.cli.app import main

    make_hf_vit().save_pretrained(tmp_path / "vit")
    assert main(["check-adapter", "--backbone", str(tmp_path / "vit"), "--examples", "1"]) == 0
    assert "HFViTAdapter on 1 example(s)" in capsys.readouterr().out
    assert main(["check-adapter", "--backbone", str(tmp_path / "vit"), "--import", "no_such_module_45"]) == 2
    assert "--import no_such_module_45: No module named 'no_such_module_45'" in capsys.readouterr().err


def test_the_check_runs_a_training_backbone_in_eval_mode_and_leaves_it_training():
    config = transformers.BertConfig(**{**TINY_HF["hf-bert"][2], "hidden_dropout_prob": 0.3}, num_labels=2)
    bert = transformers.BertForSequenceClassification(config).train()
    ids, mask, types = text_batch()
    report = check(bert, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    assert report.ok and bert.training, str(report)
