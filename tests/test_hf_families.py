"""Every Hugging Face classifier family sopfast knows, from a tiny random config (``sopfast.testing.TINY_HF``):
found by type and by name, ``drop`` equal to ``exact`` where the family claims it, the model's own forward
reproduced, the -F baselines running on it.  ``exact`` = the authors' algorithm: ``tests/test_exact_vs_reference.py``;
the command line: ``tests/test_cli_families.py``."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.adapters import adapter_class, find_adapter_class
from sopfast.model.reference import reference_forward
from sopfast.testing import TINY_HF, make_hf, text_batch

VISION = [f for f, (_, model, _) in TINY_HF.items() if "Image" in model]
TEXT = [f for f in TINY_HF if f not in VISION]
DROP_EQUALS_EXACT = [f for f in TEXT if f != "hf-deberta-v2"]  # absolute positions
EXACT_ONLY = {"hf-beit": "relative position bias", "hf-swin": "shifted windows", "hf-deberta-v2": "relative positions"}


def inputs_for(family: str) -> tuple[torch.Tensor, ...]:
    if family in VISION:
        return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)
    return text_batch()


def sop(family: str, **options) -> sopfast.SOP:
    torch.manual_seed(0)
    return sopfast.SOP(make_hf(family), recipe="paper", num_groups=4, tau=0.25, **options).eval()


def test_at_least_five_vision_and_six_text_families_are_listed_by_name():
    assert len(VISION) >= 5 and len(TEXT) >= 6
    assert set(TINY_HF) <= set(sopfast.adapters.list_adapters())


@pytest.mark.parametrize("family", list(TINY_HF))
def test_each_family_is_found_by_type_and_chosen_by_name(family):
    backbone = make_hf(family)
    assert find_adapter_class(backbone) is adapter_class(family)
    model = sopfast.SOP(backbone, adapter=family, num_groups=3)
    assert type(model.adapter) is adapter_class(family) and model.config["adapter"] == family


@pytest.mark.parametrize("family", list(TINY_HF))
def test_full_forward_is_the_models_own_forward(family):
    """On the unmasked input the adapter's forward is the classifier's (RoBERTa: its positions too)."""
    model = sop(family)
    args = inputs_for(family)
    with torch.no_grad():
        logits, keys = model.adapter.full_forward(model.prepare(*args))
        if family in VISION:
            own = model.backbone(pixel_values=args[0]).logits
        else:
            ids, mask, types = args
            with_types = {} if family == "hf-distilbert" else {"token_type_ids": types}
            own = model.backbone(input_ids=ids, attention_mask=mask, **with_types).logits
    torch.testing.assert_close(logits, own, atol=1e-6, rtol=0)
    assert keys.shape == (args[0].shape[0], model.adapter.key_dim)


@pytest.mark.parametrize("family", DROP_EQUALS_EXACT)
def test_drop_equals_exact_for_text_with_absolute_positions(family):
    model = sop(family)
    torch.nn.init.normal_(model.adapter.classifier_weight())  # logits of order 1, so a difference would show
    args = inputs_for(family)
    with torch.no_grad():
        exact, drop = model(*args, mode="exact"), model(*args, mode="drop")
    assert model.adapter.exact_modes == ("exact", "drop")
    assert exact.group_logits.std() > 0.01
    torch.testing.assert_close(drop.group_logits, exact.group_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(drop.logits, exact.logits, atol=1e-5, rtol=1e-5)


def test_roberta_runs_every_token_at_its_position_in_the_input():
    """RoBERTa's own rule numbers only the non-[PAD] tokens, so a masked token would shift the ones after
    it: the group passes run each token at ``pad_token_id + 1 + column`` instead."""
    model = sop("hf-roberta")
    ids, mask, types = text_batch()
    inputs = model.prepare(ids, mask, types)
    with torch.no_grad():
        groups = model.make_groups(inputs)
        out = model.predict_groups(inputs, groups, "exact")
        keep = groups.mask[0, 0] | (types[0] == 1)
        masked = torch.where(keep, ids[0], torch.full_like(ids[0], model.adapter.pad))[None]
        positions = torch.arange(14)[None] + model.backbone.config.pad_token_id + 1
        own = model.backbone(
            input_ids=masked, attention_mask=(mask[0] * keep)[None], token_type_ids=types[:1], position_ids=positions
        ).logits
    torch.testing.assert_close(out.group_logits[0, 0], own[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", sorted(EXACT_ONLY))
def test_exact_only_families_refuse_drop_saying_why(family):
    reason = rf"mode='drop' is not supported .*{EXACT_ONLY[family]}.*supported: \('exact',\)"
    with pytest.raises(ValueError, match=reason):
        sop(family, mode="drop")
    assert adapter_class(family).exact_modes == ("exact",)


def test_vision_drop_is_not_claimed_exact():
    for family in ("hf-vit", "hf-deit", "hf-dinov2"):
        assert adapter_class(family).supported_modes == ("exact", "drop")
        assert adapter_class(family).exact_modes == ("exact",)


def test_distilled_deit_averages_its_two_heads():
    import transformers

    config_name, _, arguments = TINY_HF["hf-deit"]
    cfg = getattr(transformers, config_name)(**arguments)
    cfg.num_labels = 3
    torch.manual_seed(0)
    backbone = transformers.DeiTForImageClassificationWithTeacher(cfg).eval()
    model = sopfast.SOP(backbone, recipe="paper", num_groups=4, tau=0.25, mode="exact").eval()
    x = inputs_for("hf-deit")[0]
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, reference_forward(model, x).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.adapter.full_forward(model.prepare(x))[0], backbone(x).logits)


@pytest.mark.parametrize("family", list(TINY_HF))
def test_f_baselines_run_on_every_family(family):
    model = sop(family)
    args = inputs_for(family)
    batch = {"pixel_values": args[0]} if family in VISION else dict(zip(("input_ids", "attention_mask"), args[:2]))
    batch["labels"] = torch.zeros(args[0].shape[0], dtype=torch.long)
    results = sopfast.evaluate(
        model, [batch], metrics=["accuracy", "fidelity"], baselines=["gxi-f", "gradcam-f", "fresh"], progress=False
    )
    assert {"GxI-F", "GradCAM-F", "FRESH"} <= set(results)
    assert all(r["fidelity"] < 1e-5 for n, r in results.items() if n != "Backbone")
