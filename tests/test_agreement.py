"""Issue #41: SOP's agreement with the backbone it explains, reported wherever accuracy is (evaluate, the
demo's tables, predict, the model card, training's validation, diagnose), the bounds that say where a
grouped prediction loses it, and the options that train SOP to agree (agreement prior, sufficiency,
distillation)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import sopfast
from sopfast.demo.report import format_comparison
from sopfast.evaluation import metrics as M
from sopfast.model.agreement import agreement_scores, group_bounds
from sopfast.model.losses import distillation_loss, sufficiency_loss
from sopfast.testing import make_hf_vit

X = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
Y = torch.tensor([0, 1, 2, 0, 1, 2])


def model(**options) -> sopfast.SOP:
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=4, **options).eval()


def disagreeing(sop: sopfast.SOP) -> sopfast.SOP:
    """``sop`` whose backbone, on whole inputs, predicts the class after SOP's (a backbone it never agrees
    with, by construction); the group passes are untouched."""
    full_forward = sop.adapter.full_forward

    def shifted(inputs):
        logits, keys = full_forward(inputs)
        with torch.no_grad():
            sop_class = sop.predict_groups(inputs, sop.make_groups(inputs)).logits.argmax(-1)
        target = (sop_class + 1) % logits.shape[1]
        logits = logits.clone()
        logits[torch.arange(len(logits)), target] = logits.max(-1).values + 5.0
        return logits, keys

    sop.adapter.full_forward = shifted
    return sop


def test_evaluate_reports_agreement_and_kl_against_the_backbones_full_input_prediction():
    sop = model()
    results = sopfast.evaluate(sop, [(X, Y)], metrics=["accuracy", "agreement"], baselines=["random"], progress=False)
    with torch.no_grad():
        logits, reference = sop(X).logits, sop.adapter.full_forward(sop.prepare(X))[0]
    expected = (logits.argmax(-1) == reference.argmax(-1)).float().mean()
    kl = F.kl_div(logits.log_softmax(-1), reference.log_softmax(-1), log_target=True, reduction="batchmean")
    assert results["SOP"]["agreement"] == pytest.approx(float(expected))
    assert results["SOP"]["agreement_kl"] == pytest.approx(float(kl), rel=1e-4)
    assert 0 <= results["Random"]["agreement"] <= 1
    assert results["Backbone"]["agreement"] == 1.0


def test_a_model_that_disagrees_by_construction_scores_zero_agreement_everywhere(tmp_path):
    sop = disagreeing(model(agreement_prior=0.0))  # a selector that does not look at the backbone's answer
    results = sopfast.evaluate(sop, [(X, Y)], metrics=["agreement"], progress=False)
    assert results["SOP"]["agreement"] == 0.0 and results["SOP"]["agreement_kl"] > 1.0
    report = sopfast.diagnose(sop, TensorDataset(X, Y), progress=False, informed_examples=0)
    own = report.own_groups
    assert own is not None and own.agreement == 0.0
    assert own.selector_misses == pytest.approx(own.generator_bound)  # wherever a group agrees, SOP misses it
    assert ("the selector loses" in "\n".join(own.lines("drop"))) == (own.selector_misses > 0.05)
    sopfast.predict(sop, TensorDataset(X, Y), tmp_path / "out", progress=False)
    rows = pq.read_table(next((tmp_path / "out" / "data").glob("*.parquet"))).to_pydict()
    assert all(p != b for p, b in zip(rows["prediction"], rows["backbone_prediction"]))


def test_predict_writes_the_backbones_own_prediction(tmp_path):
    sop = model()
    sopfast.predict(sop, TensorDataset(X, Y), tmp_path / "out", progress=False)
    rows = pq.read_table(next((tmp_path / "out" / "data").glob("*.parquet"))).to_pydict()
    with torch.no_grad():
        reference = sop.adapter.full_forward(sop.prepare(X))[0].argmax(-1)
    assert rows["backbone_prediction"] == reference.tolist()
    assert "prediction != df.backbone_prediction" in (tmp_path / "out" / "README.md").read_text()


def test_group_bounds_by_hand():
    # 2 examples, 3 groups, 3 classes; the backbone predicts class 2 and class 0 on the whole inputs
    group_logits = torch.tensor(
        [
            [[3.0, 0, 0], [0, 0, 2.0], [0, 0, 5.0]],  # groups 1 and 2 agree; the first agreeing is group 1
            [[0, 4.0, 0], [0, 0, 1.0], [0, 2.0, 0]],  # none agrees; the most confident is group 0 (class 1)
        ]
    )
    reference = torch.tensor([[0, 0, 1.0], [1.0, 0, 0]])
    bounds = group_bounds(group_logits, reference, torch.tensor([2, 1]))
    assert bounds["generator_bound"].tolist() == [1.0, 0.0]
    assert bounds["one_group_agrees"].tolist() == pytest.approx([2 / 3, 0.0])
    assert bounds["generator_bound_correct"].tolist() == [1.0, 1.0]
    assert bounds["selector_bound"].tolist() == [1.0, 1.0]
    bounds = group_bounds(group_logits, reference, torch.tensor([2, 2]))
    assert bounds["selector_bound"].tolist() == [1.0, 0.0]  # the most confident group of example 1 says 1
    assert "selector_misses" not in bounds  # only with the method's logits


def test_selector_misses_counts_the_inputs_where_a_group_agrees_and_the_method_does_not():
    group_logits = torch.tensor(
        [
            [[3.0, 0, 0], [0, 0, 2.0]],  # group 1 agrees with the backbone (class 2)
            [[3.0, 0, 0], [0, 0, 2.0]],  # the same groups
            [[0, 4.0, 0], [0, 1.0, 0]],  # no group agrees with the backbone (class 0)
        ]
    )
    reference = torch.tensor([[0, 0, 1.0], [0, 0, 1.0], [1.0, 0, 0]])
    method = torch.tensor([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]])  # misses, agrees, disagrees with no group agreeing
    bounds = group_bounds(group_logits, reference, logits=method)
    assert bounds["selector_misses"].tolist() == [1.0, 0.0, 0.0]


def test_bounds_metric_and_the_diagnosis_of_a_trained_model_match_group_bounds():
    sop = model()
    results = sopfast.evaluate(sop, [(X, Y)], metrics=["bounds"], progress=False)
    with torch.no_grad():
        out = sop(X)
        reference = sop.adapter.full_forward(sop.prepare(X))[0]
    expected = {k: float(v.mean()) for k, v in group_bounds(out.group_logits, reference, Y, out.logits).items()}
    assert set(expected) >= {"selector_misses", "selector_bound", "generator_bound"}
    for key, value in expected.items():
        assert results["SOP"][key] == pytest.approx(value)
    own = sopfast.diagnose(sop, TensorDataset(X, Y), progress=False, informed_examples=0).own_groups
    assert own is not None
    assert (own.generator_bound, own.selector_bound, own.selector_misses) == pytest.approx(
        (expected["generator_bound"], expected["selector_bound"], expected["selector_misses"])
    )
    assert own.accuracy == pytest.approx(float((out.logits.argmax(-1) == Y).float().mean()))


def test_the_agreement_prior_hands_each_class_to_the_group_that_best_predicts_the_backbones_class():
    sop = model(agreement_prior=1e4)
    with torch.no_grad():
        out = sop(X)
    assert out.backbone_logits is not None
    best = agreement_scores(out.group_logits, out.backbone_logits).argmax(dim=1)
    chosen = out.group_logits[torch.arange(len(X)), best]
    torch.testing.assert_close(out.logits, chosen)  # λ = 1 (unit_lambda), one group weighted 1 per class
    assert bool((out.group_scores.argmax(-1) == best.view(-1, 1)).all())
    plain = model(agreement_prior=0.0)
    with torch.no_grad():
        assert plain(X).backbone_logits is None  # no prior, no extra backbone pass


def test_the_prior_can_be_added_to_a_text_model_trained_without_it():
    from sopfast.testing import make_bert, text_batch

    backbone = make_bert()
    torch.manual_seed(0)
    trained = sopfast.SOP(backbone, num_groups=4, agreement_prior=0.0).eval()  # as 0.6.0's text recipe trained
    with_prior = sopfast.SOP(backbone, num_groups=4, agreement_prior=1e4).eval()
    with_prior.load_state_dict(trained.state_dict())
    ids, mask, types = text_batch()
    with torch.no_grad():
        before = trained(ids, mask, types).group_scores
        trained.agreement_prior = 1e4
        after, expected = trained(ids, mask, types), with_prior(ids, mask, types)
    torch.testing.assert_close(after.group_scores, expected.group_scores)
    torch.testing.assert_close(after.logits, expected.logits)
    assert (after.group_scores - before).abs().max() > 0.1  # the prior changed the selection


def test_random_groups_go_through_the_same_selector_with_its_prior():
    sop = model(agreement_prior=1e4)
    results = sopfast.evaluate(sop, [(X, Y)], metrics=["agreement", "bounds"], baselines=["random"], progress=False)
    # with the prior dominating, a method agrees wherever its best group for the backbone's class agrees
    assert results["Random"]["agreement"] >= results["Random"]["one_group_agrees"] - 1e-6


def test_sufficiency_loss_raises_lambda_of_groups_better_than_the_inputs_others():
    group_logits = torch.tensor([[[5.0, 0.0], [0.0, 5.0], [1.0, 1.0]]])  # the backbone says class 0
    lam = torch.zeros(1, 3, requires_grad=True)
    sufficiency_loss(group_logits, lam, torch.tensor([[1.0, 0.0]])).backward()
    assert lam.grad is not None
    descent = -lam.grad[0]
    assert descent[0] > 0 > descent[1]  # agreeing group up, disagreeing group down
    assert sufficiency_loss(group_logits[:, :1], lam[:, :1], torch.tensor([[1.0, 0.0]])) == 0


def test_distillation_loss_is_the_kl_from_the_backbones_distribution():
    reference, logits = torch.randn(4, 5), torch.randn(4, 5)
    expected = (reference.softmax(-1) * (reference.log_softmax(-1) - logits.log_softmax(-1))).sum(-1).mean()
    assert distillation_loss(logits, reference) == pytest.approx(float(expected), rel=1e-5)
    assert distillation_loss(reference, reference) == pytest.approx(0.0, abs=1e-6)
    assert M.agreement_kl(logits, reference) == pytest.approx(float(expected), rel=1e-5)


def test_training_terms_are_logged_and_validation_reports_agreement(tmp_path):
    sop = model(sufficiency_weight=1.0, distill_weight=1.0, agreement_prior=2.0).train()
    out = sop(X, labels=Y)
    assert {"sufficiency", "distill"} <= set(out.penalty_terms)
    out.loss.backward()
    result = sopfast.train(
        model(),
        TensorDataset(X, Y),
        TensorDataset(X, Y),
        epochs=1,
        batch_size=3,
        output_dir=tmp_path / "run",
        progress=False,
        diagnose=False,
    )
    assert 0.0 <= result.metrics["val_agreement"] <= 1.0
    card = (tmp_path / "run" / "best" / "README.md").read_text()
    assert "agreement with the backbone's full-input prediction" in card


def test_class_comparing_options_are_off_for_regression_and_refused_when_given():
    sop = sopfast.SOP(make_hf_vit(), num_groups=4, task="regression", class_weights=torch.randn(3, 32))
    assert sop.agreement_prior == sop.sufficiency_weight == sop.distill_weight == 0.0
    with pytest.raises(ValueError, match=r"agreement_prior=1\.0 compares classes"):
        sopfast.SOP(make_hf_vit(), num_groups=4, task="regression", agreement_prior=1.0)
    with pytest.raises(ValueError, match="sufficiency_weight"):
        model(sufficiency_weight=-1.0)


def test_the_backbones_full_input_logits_are_computed_once_for_the_same_inputs(monkeypatch):
    sop = model()
    calls = []
    full_forward = sop.adapter.full_forward
    monkeypatch.setattr(sop.adapter, "full_forward", lambda inputs: calls.append(1) or full_forward(inputs))
    inputs = sop.prepare(X.clone())
    first = sop.reference_logits(inputs)
    assert torch.equal(sop.reference_logits(inputs), first) and len(calls) == 1
    inputs.pixels.mul_(0.5)  # changed in place: computed again
    assert not torch.equal(sop.reference_logits(inputs), first) and len(calls) == 2
    with torch.no_grad():
        next(sop.backbone.parameters()).mul_(2.0)  # the backbone's weights changed: computed again
    sop.reference_logits(inputs)
    assert len(calls) == 3


def test_the_demo_table_shows_agreement_beside_accuracy():
    table = format_comparison({"SOP": {"accuracy": 0.8, "agreement": 0.9, "agreement_kl": 0.2}})
    assert "agrees with the backbone" in table and "0.900" in table


def test_a_diagnosis_saved_before_selector_misses_reads_without_it():
    from sopfast.masking.own_groups import OwnGroups

    saved = {"accuracy": 0.8, "agreement": 0.7, "generator_bound": 0.9, "selector_bound": 0.85, "one_group_agrees": 0.4}
    own = OwnGroups(**saved)
    assert own.selector_misses is None
    assert not any("the selector loses" in line for line in own.lines("drop"))


def test_the_selector_uses_the_training_prior_in_training_and_the_agreement_prior_at_inference():
    sop = model(agreement_prior=1e4, train_agreement_prior=0.0)
    inputs = sop.prepare(X)
    with torch.no_grad():
        groups = sop.make_groups(inputs)
        preds = sop.adapter.run_groups(inputs, groups, sop.mode, chunk_size=16)
        reference = sop.reference_logits(inputs)
        at_inference = sop.select(preds, reference)
        trained = sop.train().select(preds, reference)
    assert sop.selection_prior == 0.0 and sop.eval().selection_prior == 1e4
    torch.testing.assert_close(trained, sop.selector(preds.keys))  # no prior in training
    torch.testing.assert_close(at_inference, sop.selector(preds.keys, 1e4 * agreement_scores(preds.logits, reference)))
    assert (at_inference - trained).abs().max() > 0.1


def test_an_agreement_prior_given_alone_is_the_training_prior_too():
    from sopfast.testing import make_bert

    text = sopfast.SOP(make_bert(), num_groups=4)
    assert (text.agreement_prior, text.train_agreement_prior) == (10.0, 3.0)  # the text recipe's
    given = sopfast.SOP(make_bert(), num_groups=4, agreement_prior=5.0)
    assert (given.agreement_prior, given.train_agreement_prior, given.train().selection_prior) == (5.0, None, 5.0)
    both = sopfast.SOP(make_bert(), num_groups=4, agreement_prior=5.0, train_agreement_prior=1.0)
    assert (both.agreement_prior, both.train().selection_prior, both.eval().selection_prior) == (5.0, 1.0, 5.0)
    image = model()
    assert (image.agreement_prior, image.train_agreement_prior, image.train().selection_prior) == (3.0, None, 3.0)


def test_a_bad_training_prior_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"train_agreement_prior.*-1\.0"):
        model(train_agreement_prior=-1.0)
    with pytest.raises(ValueError, match=r"train_agreement_prior=2\.0 compares classes"):
        sopfast.SOP(make_hf_vit(), num_groups=4, task="regression", train_agreement_prior=2.0)
    regression = sopfast.SOP(make_hf_vit(), num_groups=4, task="regression", class_weights=torch.randn(3, 32))
    assert regression.train_agreement_prior is None and regression.train().selection_prior == 0.0


def test_a_prior_in_training_alone_computes_the_backbones_answer_in_training():
    sop = model(recipe="paper", train_agreement_prior=3.0).train()  # no prior at inference, no penalties
    out = sop(X, labels=Y)
    assert out.backbone_logits is not None  # the training prior selects by it
    out.loss.backward()
    with torch.no_grad():
        assert sop.eval()(X).backbone_logits is None


def test_text_checkpoints_keep_their_priors_and_a_prior_given_on_loading_leads_both(tmp_path):
    from sopfast.model.checkpoint import CONFIG_NAME, _config_sha256
    from sopfast.testing import make_bert

    backbone = make_bert()
    sopfast.SOP(backbone, num_groups=4).save_pretrained(tmp_path / "new")
    new = sopfast.SOP.from_pretrained(tmp_path / "new", backbone)
    assert (new.agreement_prior, new.train_agreement_prior) == (10.0, 3.0)
    given = sopfast.SOP.from_pretrained(tmp_path / "new", backbone, agreement_prior=5.0)
    assert (given.agreement_prior, given.train_agreement_prior) == (5.0, None)
    both = sopfast.SOP.from_pretrained(tmp_path / "new", backbone, agreement_prior=5.0, train_agreement_prior=1.0)
    assert (both.agreement_prior, both.train_agreement_prior) == (5.0, 1.0)
    sopfast.SOP(backbone, num_groups=4, agreement_prior=3.0).save_pretrained(tmp_path / "old")
    config_file = tmp_path / "old" / CONFIG_NAME
    saved = json.loads(config_file.read_text())
    del saved["config"]["train_agreement_prior"]  # as sopfast 0.6.4 wrote its text checkpoints
    saved["sopfast_version"] = "0.6.4"
    saved["sha256"][CONFIG_NAME] = _config_sha256(saved)
    config_file.write_text(json.dumps(saved))
    old = sopfast.SOP.from_pretrained(tmp_path / "old", backbone)
    assert (old.eval().selection_prior, old.train().selection_prior) == (3.0, 3.0)


def test_priors_and_blank_ranking_set_after_construction_are_saved(tmp_path):
    sop = model()
    sop.agreement_prior, sop.train_agreement_prior, sop.demote_blank = 7.0, 2.0, False
    sop.save_pretrained(tmp_path)
    loaded = sopfast.SOP.from_pretrained(tmp_path, sop.backbone)
    assert (loaded.agreement_prior, loaded.train_agreement_prior, loaded.demote_blank) == (7.0, 2.0, False)


def test_priors_and_blank_ranking_set_after_construction_are_checked():
    sop = model()
    with pytest.raises(ValueError, match=r"agreement_prior must be a finite number ≥ 0.0, got -1\.0"):
        sop.agreement_prior = -1.0
    with pytest.raises(ValueError, match=r"train_agreement_prior must be a finite number ≥ 0.0 or None, got -2\.0"):
        sop.train_agreement_prior = -2.0
    with pytest.raises(TypeError, match="demote_blank"):
        sop.demote_blank = "yes"
    sop.train_agreement_prior = None
    assert (sop.agreement_prior, sop.train().selection_prior) == (3.0, 3.0)
