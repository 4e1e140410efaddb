"""One owner for each piece of knowledge (issue #30, item 4): the metric registry behind the CLI's choices,
device names checked before use, the data defaults, the recipe options, the authors' weight renames in the
adapter, and typed trainer callbacks.  (The drop FLOP model: tests/test_bench.py.)"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import transformers
from torch.utils.data import DataLoader, TensorDataset

import sopfast
from sopfast import defaults
from sopfast.adapters import preprocessing
from sopfast.cli import build_parser
from sopfast.data import datasets, splits, user_data
from sopfast.evaluation.registry import REGISTRY, Metric
from sopfast.model import authors
from sopfast.model.recipes import RECIPE_OPTIONS, RECIPES
from sopfast.testing import make_hf, make_hf_vit

MAJOR = int(transformers.__version__.split(".")[0])


def test_a_registered_metric_is_a_choice_of_evaluate_metrics(monkeypatch):
    metric = Metric("lambda_sign", collect=lambda step: {}, finalize=lambda kept, plan, model: {})
    monkeypatch.setitem(REGISTRY, metric.name, metric)
    args = build_parser().subcommands["evaluate"].parse_args(["--checkpoint", "x", "--metrics", "lambda_sign"])
    assert args.metrics == ["lambda_sign"]


@pytest.mark.parametrize(("device", "match"), [("foo", "is not a device"), ("meta", "is not supported")])
def test_train_checks_the_device_name_before_using_it(device, match):
    model = sopfast.SOP(make_hf_vit(), num_groups=2)
    data = [(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))]
    with pytest.raises(ValueError, match=rf"^device '{device}' {match}; allowed: cpu, cuda, cuda:N, mps$"):
        sopfast.train(model, data, device=device, progress=False)


def _default(function, name: str):
    return inspect.signature(function).parameters[name].default


def test_data_defaults_have_one_home():
    train = build_parser().subcommands["train"]
    evaluate = build_parser().subcommands["evaluate"]
    assert train.get_default("holdout") is None  # not given: the model's, else the default (resolve_data_flags)
    assert f"default {defaults.HOLDOUT}," in train._option_string_actions["--holdout"].help
    assert defaults.HOLDOUT == splits.DataOptions().holdout
    assert (
        _default(user_data.load_split, "holdout") == _default(user_data.Source.resolve, "holdout") == defaults.HOLDOUT
    )
    assert train.get_default("batch_size") == evaluate.get_default("batch_size") == defaults.BATCH_SIZE
    assert preprocessing.Preprocessing("text").max_length == defaults.MAX_LENGTH
    assert _default(datasets.TextDataset.tokenize, "max_length") == defaults.MAX_LENGTH


def test_sop_lists_the_recipe_options_once_and_takes_each_given():
    """The constructor's signature is the one list: every recipe option is a parameter defaulting to None
    (from the recipe), and each one given reaches the model."""
    parameters = inspect.signature(sopfast.SOP).parameters
    assert all(parameters[name].default is None for name in RECIPE_OPTIONS)
    given = {
        "group_gen_scale": 3.0,
        "center_embeddings": False,
        "queries": "fixed",
        "normalize_logits": False,
        "diversity_weight": 0.5,
        "saliency_weight": 0.25,
        "saliency_loss": "align",
        "saliency_levels": (0.5,),
        "key_score": False,
        "unit_lambda": False,
        "demote_blank": False,
        "keep_special_tokens": False,
        "agreement_prior": 1.0,
        "train_agreement_prior": 2.0,
        "sufficiency_weight": 1.5,
        "distill_weight": 0.5,
        "explore": 0.25,
    }
    assert set(given) == set(RECIPE_OPTIONS)
    assert all(given[name] != RECIPES["sopfast"].model[name] for name in given)
    model = sopfast.SOP(make_hf_vit(), recipe="sopfast", **given)
    assert {name: model.config[name] for name in given} == given


def test_the_authors_weight_renames_live_in_the_adapter():
    assert "q_proj" not in inspect.getsource(authors)
    rename = sopfast.adapters.adapter_class("hf-deit").weight_name
    legacy = "deit.encoder.layer.1.attention.attention.query.weight"
    names = set(make_hf("hf-deit").state_dict())
    assert rename(legacy) in names if MAJOR >= 5 else legacy in names
    assert sopfast.adapters.adapter_class("hf-bert").weight_name(legacy) == legacy  # another family: unchanged


class Recorder(sopfast.TrainerCallback):
    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def on_train_begin(self, trainer, record):
        self.events.append(("begin", record))

    def on_step_end(self, trainer, record):
        self.events.append(("step", record))

    def on_log(self, trainer, record):
        self.events.append(("log", record))

    def on_evaluate(self, trainer, record):
        self.events.append(("eval", record))

    def on_save(self, trainer, record):
        self.events.append(("save", record))

    def on_train_end(self, trainer, record):
        self.events.append(("end", record))
        trainer.should_stop = True


def _data(n: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.arange(n) % 3), batch_size=2)


def test_typed_callbacks_get_every_event_in_order(tmp_path):
    recorder = Recorder()
    model = sopfast.SOP(make_hf_vit(), num_groups=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        sopfast.train(model, _data(), _data(2), epochs=1, output_dir=tmp_path, callbacks=[recorder], progress=False)
    names = [name for name, _ in recorder.events]
    assert names[0] == "begin" and names[-1] == "end" and names.count("step") == 2
    assert names.index("eval") < names.index("end") and "log" in names
    saved = {record["what"] for name, record in recorder.events if name == "save"}
    assert saved == {"state", "best", "last"}
    assert recorder.events[0][1] == {"step": 0, "total_steps": 2}


def test_old_function_callbacks_still_work_with_a_deprecation_warning():
    seen = []
    model = sopfast.SOP(make_hf_vit(), num_groups=2)
    with pytest.warns(DeprecationWarning, match="subclass sopfast.TrainerCallback"):
        sopfast.train(model, _data(), epochs=1, callbacks=[lambda t, event, record: seen.append(event)], progress=False)
    assert seen == ["step", "step", "log", "end"]
    with pytest.raises(TypeError, match=r"callbacks must be sopfast\.TrainerCallback instances"):
        sopfast.train(model, _data(), callbacks=[Recorder], progress=False)
