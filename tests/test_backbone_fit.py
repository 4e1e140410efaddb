"""The backbone a user brings: the diagnostic of what SOP can reach over it (sopfast.diagnose), the
opt-in masking adaptation of a copy (sopfast.adapt_backbone, ``sopfast adapt``), and a training length
set by the data with early stopping (``sopfast.train(epochs=None)``)."""

from __future__ import annotations

import json

import pytest
import torch

import sopfast
from sopfast.adapters import get_adapter
from sopfast.adapters.sources import load_backbone
from sopfast.cli.app import main
from sopfast.demo.report import _diagnosis_lines
from sopfast.masking import masked_forward, random_groups
from sopfast.masking.adapt import PROVENANCE_NAME
from sopfast.masking.diagnose import (
    DIAGNOSIS_NAME,
    Diagnosis,
    GroupAccuracy,
    informed_group,
    verdict,
)
from sopfast.model.checkpoint import hash_backbone
from sopfast.ops import num_kept
from sopfast.testing import make_bert, make_cnn, make_hf_vit, text_batch


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    model = make_hf_vit(num_labels=3).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(20)
    return model


def _images(n: int = 12, seed: int = 0) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, 3, (n,), generator=gen)
    )


# -- the diagnostic ---------------------------------------------------------------------------------
def test_diagnose_measures_whole_inputs_and_random_groups_in_every_mode(vit):
    data = _images(10)
    report = sopfast.diagnose(vit, data, tau=0.25, num_groups=3, examples=10, informed_examples=0, progress=False)
    x, y = data.tensors
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))  # the examples it draws, in order
    x, y = x[order], y[order]
    with torch.no_grad():
        full = (vit(pixel_values=x).logits.argmax(-1) == y).float().mean()
    assert report.full_accuracy == pytest.approx(float(full))
    assert set(report.random_groups) == {"exact", "drop"} and report.mode == "drop" and report.examples == 10
    generator = torch.Generator().manual_seed(0)
    torch.randperm(10, generator=generator)  # the draw of the examples comes first
    masks = random_groups(torch.ones(10, 16, dtype=torch.bool), 0.25, 3, generator)
    for mode in ("exact", "drop"):
        logits = masked_forward(vit, x, masks, mode=mode)
        correct = logits.argmax(-1) == y[:, None]
        got = report.random_groups[mode]
        assert got.one_group == pytest.approx(float(correct.float().mean()))
        assert got.best_of_groups == pytest.approx(float(correct.any(1).float().mean()))
        averaged = logits.softmax(-1).mean(1).argmax(-1) == y
        assert got.mean_of_groups == pytest.approx(float(averaged.float().mean()))
    assert report.chance == pytest.approx(float(torch.bincount(y).max()) / 10)  # the most common class's share
    assert report.labels == "labels"
    text = str(report)
    assert "full input" in text and "verdict:" in text and "SOP's should beat it" in text


def test_diagnose_without_labels_scores_against_the_backbone_and_reads_an_sop_model(vit):
    unlabelled = [torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    report = sopfast.diagnose(vit, unlabelled, examples=6, informed_examples=2, progress=False)
    assert report.full_accuracy == 1.0 and report.labels == "backbone predictions" and report.examples == 6
    assert report.informed_examples == 2 and 0 <= report.informed_group <= 1
    model = sopfast.SOP(vit, num_groups=4, tau=0.5, mode="exact")
    from_model = sopfast.diagnose(model, _images(4), progress=False)
    assert (from_model.tau, from_model.num_groups, from_model.mode) == (0.5, 4, "exact")
    regression = sopfast.SOP(vit, num_groups=2, task="regression")  # measured in MSE: class ids are no targets
    with pytest.raises(ValueError, match=r"regression targets must be real numbers of shape \[B, 3\]"):
        sopfast.diagnose(regression, _images(4), progress=False)


def test_random_groups_hold_k_of_each_examples_candidates():
    bert = make_bert()
    ids, attention, types = text_batch()
    adapter = get_adapter(bert)
    valid = adapter.candidate_mask(adapter.prepare(ids, attention, types))
    masks = random_groups(valid, 0.3, 5, torch.Generator().manual_seed(1))
    assert masks.shape == (3, 5, 14)
    assert not bool((masks & ~valid.unsqueeze(1)).any())
    for b, count in enumerate(valid.sum(1).tolist()):
        assert set(masks[b].sum(-1).tolist()) == {num_kept(0.3, count)}
    report = sopfast.diagnose(
        bert, [{"input_ids": ids, "attention_mask": attention, "labels": torch.tensor([0, 1, 0])}], progress=False
    )
    assert report.random_groups["drop"] == report.random_groups["exact"]  # BERT drop = exact


def test_informed_group_keeps_the_features_whose_removal_costs_most(vit):
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    adapter = get_adapter(vit)
    inputs = adapter.prepare(x)
    target = vit(pixel_values=x).logits.argmax(-1)
    logits = informed_group(adapter, inputs, target, 0.25, "exact")
    without = ~torch.eye(16, dtype=torch.bool).expand(2, 16, 16)
    probs = masked_forward(vit, x, without, mode="exact").softmax(-1)
    cost = -probs[torch.arange(2), :, target]
    group = torch.zeros(2, 16, dtype=torch.bool).scatter(1, cost.topk(4, dim=1).indices, True)
    torch.testing.assert_close(logits, masked_forward(vit, x, group.unsqueeze(1), mode="exact")[:, 0].float())


def _report(full: float, one: dict[str, float], chance: float = 0.1) -> Diagnosis:
    groups = {mode: GroupAccuracy(acc, acc, acc) for mode, acc in one.items()}
    return Diagnosis(0.2, 20, "drop", 100, chance, full, groups, "labels")


@pytest.mark.parametrize(
    "full, one, word, advice",
    [
        (0.9, {"exact": 0.7, "drop": 0.7}, "robust", []),
        (0.9, {"exact": 0.3, "drop": 0.35}, "fragile", ["sopfast adapt", "--tau"]),
        (0.9, {"exact": 0.11, "drop": 0.12}, "blind", ["sopfast adapt", "--tau"]),
        (0.9, {"exact": 0.6, "drop": 0.12}, "blind", ["sopfast adapt", "--tau", "--mode exact"]),
        (0.12, {"exact": 0.1, "drop": 0.1}, "at chance", ["preprocessing"]),
    ],
)
def test_verdict_in_words(full, one, word, advice):
    text, lines = verdict(_report(full, one))
    assert text.startswith(word)
    assert len(lines) == len(advice) and all(a in line for a, line in zip(advice, lines))


@pytest.mark.parametrize("blank_share, named", [(0.35, True), (0.1, True), (0.05, False), (None, False)])
def test_a_larger_tau_comes_with_no_demote_blank_where_the_images_have_blank_patches(blank_share, named):
    """The default recipe ranks blank patches last: at a larger τ every group would hold the same object
    patches, so the advice to raise τ names --no-demote-blank where at least 10 % of the features are blank."""
    report = _report(0.9, {"exact": 0.3, "drop": 0.35})
    report.blank_share = blank_share
    _, advice = verdict(report)
    assert "--tau 0.4" in advice[1]
    assert ("--no-demote-blank" in advice[1]) == named
    assert ("of these features are blank" in advice[1]) == named
    if named:
        assert f"{blank_share:.0%} of these features are blank" in advice[1]


def test_diagnose_measures_the_share_of_blank_patches(vit):
    gen = torch.Generator().manual_seed(0)
    x = 0.5 + torch.rand(6, 3, 32, 32, generator=gen)
    x[:, :, :16] = 0.0  # the top half of every image is plain background: 8 of its 16 patches
    x[:2, :, 16:24] = 0.0  # and the next row of patches of the first two: 12 of 16
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 3, (6,), generator=gen))
    report = sopfast.diagnose(vit, data, num_groups=3, examples=6, informed_examples=0, progress=False)
    assert report.blank_share == pytest.approx((4 * 8 / 16 + 2 * 12 / 16) / 6)
    assert "blank features (all background): 58% of the features" in str(report)
    plain = sopfast.diagnose(vit, _images(6), num_groups=3, examples=6, informed_examples=0, progress=False)
    assert plain.blank_share == 0.0 and "blank features" not in str(plain)
    record = plain.to_dict()
    del record["blank_share"]  # a diagnosis saved before 0.6.3 reads without the line
    assert not any("blank features" in line for line in _diagnosis_lines(record))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"examples": 0}, "examples"),
        ({"tau": 1.5}, "tau"),
        ({"mode": "fast"}, "mode"),
        ({"informed_examples": -1}, "informed_examples"),
    ],
)
def test_diagnose_argument_errors(vit, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sopfast.diagnose(vit, _images(4), progress=False, **kwargs)
    with pytest.raises(ValueError, match="empty"):
        sopfast.diagnose(vit, torch.utils.data.TensorDataset(torch.zeros(0, 3, 32, 32), torch.zeros(0)), progress=False)


# -- the adaptation -----------------------------------------------------------------------------------
class _Rows(torch.utils.data.Dataset):
    """A map-style dataset of example dicts (text)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


@pytest.mark.parametrize("family", ["vit", "cnn", "bert"])
def test_adapt_changes_a_copy_and_records_where_it_came_from(family, tmp_path):
    torch.manual_seed(0)
    if family == "bert":
        backbone = make_bert()
        ids, attention, types = text_batch()
        rows = [
            {"input_ids": ids[i], "attention_mask": attention[i], "token_type_ids": types[i], "labels": i % 2}
            for i in range(3)
        ]
        data, options = _Rows(rows * 4), {}
    else:
        backbone = make_hf_vit(num_labels=3) if family == "vit" else make_cnn()
        data = (
            _images(8, 1)
            if family == "vit"
            else torch.utils.data.TensorDataset(torch.randn(8, 3, 16, 16), torch.randint(0, 3, (8,)))
        )
        options = {} if family == "vit" else {"feature_layer": "features.0"}
    before = hash_backbone(backbone)
    result = sopfast.adapt_backbone(
        backbone, data, steps=3, batch_size=4, lr=1e-3, output_dir=tmp_path / "adapted", progress=False, **options
    )
    assert hash_backbone(backbone) == before  # the original is never changed
    provenance = json.loads((tmp_path / "adapted" / PROVENANCE_NAME).read_text())
    assert provenance["original_sha256"] == before != provenance["adapted_sha256"]
    assert provenance["adapted_sha256"] == hash_backbone(result.backbone)
    assert provenance["settings"]["steps"] == 3 and "teacher" in provenance["method"]
    assert {"full_accuracy", "random_groups", "verdict"} <= set(provenance["before"]) & set(provenance["after"])
    assert not any(p.requires_grad for p in result.backbone.parameters()) and not result.backbone.training
    if family == "vit":  # a Hugging Face directory: --backbone OUTPUT_DIR
        reloaded = load_backbone(tmp_path / "adapted").model
        assert hash_backbone(reloaded) == provenance["adapted_sha256"]
    assert "whole inputs: original" in str(result)


def test_adapt_from_the_teacher_alone_needs_no_labels_and_both_weights_zero_is_refused(vit):
    unlabelled = [torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    result = sopfast.adapt_backbone(vit, unlabelled, steps=2, label_weight=0.0, progress=False)
    assert result.after.labels == "backbone predictions"
    with pytest.raises(ValueError, match="needs class labels"):
        sopfast.adapt_backbone(vit, unlabelled, steps=1, progress=False)
    with pytest.raises(ValueError, match="both 0"):
        sopfast.adapt_backbone(vit, _images(4), steps=1, label_weight=0.0, teacher_weight=0.0, progress=False)
    with pytest.raises(ValueError, match="lr"):
        sopfast.adapt_backbone(vit, _images(4), steps=1, lr=0.0, progress=False)


# -- the training length ----------------------------------------------------------------------------
def _run(vit, tmp_path, **options):
    torch.manual_seed(0)
    model = sopfast.SOP(vit, num_groups=3, tau=0.25, mode="drop")
    options = {"batch_size": 4, "progress": False, "output_dir": tmp_path / "run", **options}
    return sopfast.train(model, _images(8), _images(8, 1), **options)


def test_default_length_is_set_by_the_data_and_stops_when_validation_stalls(vit, tmp_path):
    """epochs=None: enough whole epochs for min_steps (here 2 steps an epoch, min_steps 20: 10 epochs),
    evaluated about 20 times; with a learning rate too small to change anything, the validation metric
    never improves after the first evaluation, and patience 2 stops the run — not before half the planned
    steps (10), whatever the evaluations said before."""
    result = _run(vit, tmp_path, min_steps=20, patience=2, lr=1e-12)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    evals = [r["step"] for r in records if r["event"] == "eval"]
    assert evals == list(range(1, 11)) and result.step == 10 and result.stop_reason == "early_stopping"
    end = records[-1]
    assert end["event"] == "end" and end["stop_reason"] == "early_stopping"
    assert "averaged over the last 3 evaluations, did not improve in 2 evaluations" in end["stopped"]
    assert "of 20 planned (10 epochs)" in end["stopped"]
    assert (tmp_path / "run" / "best").is_dir() and (tmp_path / "run" / "last").is_dir()


def test_early_stopping_reads_the_smoothed_metric():
    """A metric that alternates by one prediction (a rounding difference) stops nobody on its mean; a raw
    rule would have counted every dip; no stop before min_steps."""
    from sopfast.training.stopping import Stopping

    stopping = Stopping(patience=2, min_steps=0)
    noisy = [0.50, 0.55, 0.53, 0.57, 0.55, 0.59, 0.57, 0.61]  # rising, with a dip after every rise
    assert not any(stopping.evaluated(v, True, step, True) for step, v in enumerate(noisy))
    flat = Stopping(patience=2, min_steps=5)
    assert [flat.evaluated(0.5, True, step, True) for step in range(6)] == [False] * 5 + [True]
    resumed = Stopping(patience=2)
    resumed.load_state_dict(stopping.state_dict())
    assert resumed.state_dict() == stopping.state_dict()


def test_explicit_epochs_keep_their_length_and_the_run_says_why_it_stopped(vit, tmp_path):
    result = _run(vit, tmp_path, epochs=2, lr=1e-12)
    assert result.step == 4 and result.stop_reason == "epochs"
    result = _run(vit, tmp_path, epochs=3, max_steps=5, resume=False, lr=1e-12)
    assert result.step == 5 and result.stop_reason == "max_steps"

    def stop(trainer, event, record):
        if event == "step":
            trainer.should_stop = True

    result = _run(vit, tmp_path, epochs=3, resume=False, callbacks=[stop])
    assert result.step == 1 and result.stop_reason == "callback"


def test_every_run_starts_with_the_diagnostic_in_its_folder_and_log(vit, tmp_path):
    result = _run(vit, tmp_path, epochs=1, diagnose_examples=5)
    saved = json.loads((tmp_path / "run" / DIAGNOSIS_NAME).read_text())
    assert saved == result.diagnosis and saved["examples"] == 5 and saved["verdict"]
    first = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    assert first["event"] == "diagnosis" and first["full_accuracy"] == saved["full_accuracy"]
    again = _run(vit, tmp_path, epochs=2)  # a resumed run reads the saved diagnosis, and runs no other
    assert again.diagnosis == saved
    assert [json.loads(r)["event"] for r in (tmp_path / "run" / "log.jsonl").read_text().splitlines()].count(
        "diagnosis"
    ) == 1
    assert _run(vit, tmp_path, epochs=1, resume=False, diagnose=False, output_dir=tmp_path / "off").diagnosis is None


def test_train_config_checks_the_new_options():
    from sopfast.training import TrainConfig

    for name, value in (("min_steps", 0), ("patience", 0), ("diagnose_examples", 0), ("epochs", 0)):
        with pytest.raises(ValueError, match=name):
            TrainConfig(**{name: value})
    with pytest.raises(TypeError, match="diagnose"):
        TrainConfig(diagnose="yes")
    config = TrainConfig()
    assert config.planned_epochs(steps_per_epoch=17) == 59 and config.planned_epochs(steps_per_epoch=1000) == 3
    assert config.eval_interval(17) == 51 and config.eval_interval(1000) == 150
    assert config.early_stopping_patience(True) == 5 and config.early_stopping_patience(False) is None
    assert TrainConfig(epochs=3).early_stopping_patience(True) is None


# -- the command line ---------------------------------------------------------------------------------
def test_cli_diagnose_adapt_then_train_on_the_adapted_backbone(tmp_path, capsys):
    import user_data as U

    vit_dir, images = str(U.vit_dir(tmp_path)), str(U.image_folder(tmp_path, per_class=6))
    source = ["--backbone", vit_dir, "--data", images, "--no-progress"]
    report = tmp_path / "d.json"
    assert main(["diagnose", *source, "--examples", "6", "--holdout", "0.5", "--output", str(report)]) == 0
    # the validation part: half of the 9 images the test part (half of 18) leaves
    assert "verdict:" in capsys.readouterr().out and json.loads(report.read_text())["examples"] == 4
    adapted = tmp_path / "adapted"
    assert main(["adapt", *source, "--output-dir", str(adapted), "--steps", "2", "--batch-size", "4"]) == 0
    err = capsys.readouterr().err
    assert "whole inputs: original" in err and "sopfast_adaptation.json" in err
    run = tmp_path / "run"
    fast = ["--epochs", "1", "--batch-size", "4", "--num-groups", "4", "--diagnose-examples", "4"]
    assert main(["train", *source, "--backbone", str(adapted), "--output-dir", str(run), *fast]) == 0
    err = capsys.readouterr().err
    assert "backbone diagnostic on " in err and "verdict:" in err and "training stopped at step" in err
    assert (run / DIAGNOSIS_NAME).is_file()
