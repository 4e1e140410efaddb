"""Recipes (sopfast.model.recipes): the default one, the authors' one, explicit options winning,
training defaults, and checkpoints that record what they were trained with."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import TensorDataset

import sopfast
from sopfast.cli.app import main
from sopfast.model.checkpoint import CONFIG_NAME, _config_sha256
from sopfast.model.recipes import DEFAULT_RECIPE, RECIPE_OPTIONS, RECIPES, REQUIRES, get_recipe, resolve_options
from sopfast.testing import make_bert, make_hf_vit, text_batch
from sopfast.training import Trainer


def _options(model: sopfast.SOP) -> dict:
    return {name: model.config[name] for name in RECIPE_OPTIONS}


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("make", [make_hf_vit, make_bert])
def test_a_recipe_fills_every_option_not_given(name, make):
    model = sopfast.SOP(make(), recipe=name)
    assert model.config["recipe"] == name and model.recipe is RECIPES[name]
    text = model.adapter.modality == "text"
    expected = RECIPES[name].model_for(model.adapter.modality)
    assert _options(model) == {**expected, "keep_special_tokens": text and name == "sopfast"}


def test_the_default_is_sopfast_and_paper_is_the_authors_algorithm():
    assert DEFAULT_RECIPE == "sopfast" and sopfast.SOP(make_hf_vit()).config["recipe"] == "sopfast"
    paper = RECIPES["paper"].model
    assert paper["group_gen_scale"] == 1.0 and paper["queries"] == "fixed"
    assert not paper["normalize_logits"] and not paper["center_embeddings"]
    assert paper["diversity_weight"] == 0.0 and paper["saliency_weight"] == 0.0
    assert (paper["saliency_loss"], paper["saliency_levels"]) == ("align", None)
    assert not any(paper[k] for k in ("key_score", "unit_lambda", "demote_blank", "keep_special_tokens"))
    assert RECIPES["paper"].training == {"lr": 5e-6, "warmup_ratio": 0.0}


def test_sopfast_is_the_research_winner():
    """``FINAL`` of bench/quality/sweep.py (docs/quality.md, "Research (issue #11)") with keep_special_tokens,
    which the research used on text, and on image classifiers the agreement research's winner (issue #41,
    ``prior3-suff4-sal0`` of bench/quality/agreement_research.py): an agreement prior of 3, a sufficiency term
    of 4 and no saliency teacher."""
    assert RECIPES["sopfast"].model == {
        "group_gen_scale": 2.0,
        "normalize_logits": True,
        "center_embeddings": True,
        "queries": "diverse",
        "diversity_weight": 8.0,
        "saliency_weight": 0.0,
        "saliency_loss": "kl",
        "saliency_levels": (0.2, 0.6),
        "key_score": True,
        "unit_lambda": True,
        "demote_blank": True,
        "keep_special_tokens": True,
        "agreement_prior": 3.0,
        "train_agreement_prior": None,
        "sufficiency_weight": 4.0,
        "distill_weight": 0.0,
        "explore": 0.5,
    }
    assert RECIPES["sopfast"].training == {"lr": 1e-3, "warmup_ratio": 0.05}
    model = sopfast.SOP(make_hf_vit())
    assert model.generator.key_score is not None and model.unit_lambda and model.demote_blank
    assert (model.agreement_prior, model.sufficiency_weight, model.saliency_weight) == (3.0, 4.0, 0.0)


def test_sopfast_on_text_has_the_text_research_winner():
    """Issues #34 and #41 (docs/quality.md): on text an overlap penalty of 4, the agreement prior (3 in training,
    10 at inference) and sufficiency without the teacher (a teacher given explicitly averages 5 levels), no
    exploration; a regressor keeps the
    2-level teacher and no exploration."""
    assert RECIPES["sopfast"].model_by_modality == {
        "text": {
            "saliency_weight": 0.0,
            "saliency_levels": (0.1, 0.3, 0.5, 0.7, 0.9),
            "diversity_weight": 4.0,
            "agreement_prior": 10.0,
            "train_agreement_prior": 3.0,
            "explore": 0.0,
        }
    }
    assert RECIPES["sopfast"].model_for("image") == RECIPES["sopfast"].model == RECIPES["sopfast"].model_for(None)
    text, image = sopfast.SOP(make_bert()), sopfast.SOP(make_hf_vit())
    assert (text.saliency_weight, text.saliency_levels, text.diversity_weight) == (0.0, (0.1, 0.3, 0.5, 0.7, 0.9), 4.0)
    assert (text.agreement_prior, text.train_agreement_prior) == (10.0, 3.0)
    assert (text.sufficiency_weight, text.explore) == (4.0, 0.0)
    assert (image.saliency_weight, image.diversity_weight, image.explore) == (0.0, 8.0, 0.5)
    given = sopfast.SOP(make_bert(), diversity_weight=8.0, saliency_levels=(0.2, 0.6))
    assert (given.saliency_levels, given.diversity_weight) == ((0.2, 0.6), 8.0)
    assert RECIPES["paper"].model_for("text") == RECIPES["paper"].model
    regression = sopfast.SOP(make_hf_vit(), task="regression", class_weights=torch.randn(3, 32))
    assert (regression.saliency_weight, regression.saliency_levels) == (1.0, (0.2, 0.6))
    assert regression.agreement_prior == regression.sufficiency_weight == regression.explore == 0.0


def test_options_that_need_an_adapter_capability_are_off_where_it_lacks():
    assert set(REQUIRES) == {"saliency_weight", "keep_special_tokens"}
    vit, bert = sopfast.SOP(make_hf_vit()), sopfast.SOP(make_bert())
    assert not vit.adapter.keep_special_tokens and bert.adapter.keep_special_tokens
    assert bert.saliency_weight == vit.saliency_weight == 0.0  # no classifier recipe has a teacher (0.6.1)
    assert resolve_options(RECIPES["sopfast"], {}, bert.adapter, "regression")["saliency_weight"] == 1.0
    assert resolve_options(RECIPES["sopfast"], {}, object(), "regression")["saliency_weight"] == 0.0
    assert (
        resolve_options(RECIPES["sopfast"], {"keep_special_tokens": False}, bert.adapter)["keep_special_tokens"]
        is False
    )


def test_options_given_win_over_the_recipe():
    model = sopfast.SOP(make_hf_vit(), queries="fixed", diversity_weight=0.25, group_gen_scale=3.0)
    assert model.config["queries"] == "fixed" and model.generator.queries == "fixed"
    assert model.config["diversity_weight"] == 0.25 and model.generator.scale == 3.0
    given = ("queries", "diversity_weight", "group_gen_scale")
    rest = {k: v for k, v in resolve_options(RECIPES["sopfast"], {}, model.adapter).items() if k not in given}
    assert {k: model.config[k] for k in rest} == rest


def test_training_defaults_come_from_the_model_recipe_unless_given():
    data = TensorDataset(torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0]))
    for name, recipe in RECIPES.items():
        trainer = Trainer(sopfast.SOP(make_hf_vit(), recipe=name), data, batch_size=2, progress=False)
        assert (trainer.config.lr, trainer.config.warmup_ratio) == (
            recipe.training["lr"],
            recipe.training["warmup_ratio"],
        )
    ids, mask, types = text_batch()
    texts = TensorDataset(ids, mask, types, torch.tensor([0, 1] * (len(ids) // 2) + [0] * (len(ids) % 2)))
    text_trainer = Trainer(sopfast.SOP(make_bert()), texts, batch_size=2, progress=False)
    assert text_trainer.config.lr == 5e-4 == RECIPES["sopfast"].training_for("text")["lr"]  # the text research's
    given = Trainer(sopfast.SOP(make_hf_vit()), data, batch_size=2, lr=0.01, warmup_steps=3, progress=False)
    assert (given.config.lr, given.config.warmup_ratio, given.config.warmup_steps) == (0.01, 0.0, 3)


def test_checkpoints_record_the_recipe_and_old_ones_load_as_the_paper(tmp_path):
    backbone = make_hf_vit()
    model = sopfast.SOP(backbone, recipe="sopfast", diversity_weight=0.5)
    model.save_pretrained(tmp_path / "new")
    loaded = sopfast.SOP.from_pretrained(tmp_path / "new", backbone)
    assert loaded.config["recipe"] == "sopfast" and _options(loaded) == _options(model)
    old = sopfast.SOP(backbone, recipe="paper")
    old.save_pretrained(tmp_path / "old")
    config_file = tmp_path / "old" / "sop_config.json"
    saved = json.loads(config_file.read_text())
    del saved["config"]["recipe"]  # written before recipes existed (0.2): every option explicit, no checksums
    del saved["sha256"], saved["weights"]
    saved["sopfast_version"] = "0.2.0"
    config_file.write_text(json.dumps(saved))
    assert sopfast.SOP.from_pretrained(tmp_path / "old", backbone).config["recipe"] == "paper"


def test_bad_recipe_names_the_choices(capsys, tmp_path):
    with pytest.raises(ValueError, match=r"recipe must be one of \('paper', 'sopfast'\)|recipe must be one of"):
        get_recipe("fast")
    with pytest.raises(ValueError, match="recipe must be one of"):
        sopfast.SOP(make_hf_vit(), recipe="fast")
    make_hf_vit().save_pretrained(tmp_path / "vit")
    assert main(["train", "--backbone", str(tmp_path / "vit"), "--recipe", "fast"]) == 2
    assert "--recipe: invalid choice: 'fast'" in capsys.readouterr().err


def test_checkpoints_from_before_an_option_existed_load_with_it_off(tmp_path):
    backbone = make_hf_vit()
    old_sopfast = {"diversity_weight": 1.0, "saliency_weight": 0.0, "key_score": False, "unit_lambda": False}
    model = sopfast.SOP(backbone, num_groups=4, demote_blank=False, **old_sopfast).eval()
    model.save_pretrained(tmp_path)
    config_file = tmp_path / "sop_config.json"
    saved = json.loads(config_file.read_text())
    new = ("saliency_loss", "saliency_levels", "key_score", "unit_lambda", "demote_blank", "keep_special_tokens")
    for name in new:
        del saved["config"][name]
    del saved["sha256"], saved["weights"]  # as sopfast 0.2 wrote it, before these options existed
    saved["sopfast_version"] = "0.2.0"
    config_file.write_text(json.dumps(saved))
    loaded = sopfast.SOP.from_pretrained(tmp_path, backbone).eval()
    assert {n: loaded.config[n] for n in new if n != "saliency_levels"} == {
        n: RECIPES["paper"].model[n] for n in new if n != "saliency_levels"
    }
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits)


@pytest.mark.parametrize(
    ("version", "absent"),
    [
        ("0.5.3", ("agreement_prior", "sufficiency_weight", "distill_weight", "explore", "train_agreement_prior")),
        ("0.6.0", ("explore", "train_agreement_prior")),
        ("0.6.4", ("train_agreement_prior",)),
    ],
)
def test_checkpoints_from_before_an_option_existed_load_with_it_as_they_ran(tmp_path, version, absent):
    """sopfast 0.5 wrote no agreement options, 0.6.0 no exploration and 0.6.x no training prior: such a checkpoint
    loads with them off (the prior in training is then its agreement prior); one of a version that writes them
    and lacks one is refused."""
    backbone = make_hf_vit()
    model = sopfast.SOP(backbone, num_groups=4).eval()
    model.save_pretrained(tmp_path)
    config_file = tmp_path / CONFIG_NAME
    saved = json.loads(config_file.read_text())
    for name in absent:
        del saved["config"][name]
    saved["sopfast_version"] = version
    saved["sha256"][CONFIG_NAME] = _config_sha256(saved)
    config_file.write_text(json.dumps(saved))
    loaded = sopfast.SOP.from_pretrained(tmp_path, backbone)
    assert {name: loaded.config[name] for name in absent} == {name: RECIPES["paper"].model[name] for name in absent}
    saved["sopfast_version"] = "0.7.0"
    saved["sha256"][CONFIG_NAME] = _config_sha256(saved)
    config_file.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"lacks the config entries \[.*'train_agreement_prior'.*\]"):
        sopfast.SOP.from_pretrained(tmp_path, backbone)
