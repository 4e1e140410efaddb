"""sopfast.train: learning, exact resume, logs and checkpoints, argument checks."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import sopfast
from sopfast.model.checkpoint import STATE_NAME, load_training_state, save_training_state, trainable_state_dict
from sopfast.schedules import lr_factor
from sopfast.testing import make_bert, make_hf_vit, text_batch
from sopfast.training import NonFiniteLossError, TrainConfig, train


def image_data(n: int, seed: int = 0, backbone: nn.Module | None = None) -> TensorDataset:
    """``n`` random 32×32 images; labels are the backbone's own predictions (learnable) or random."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g)
    if backbone is None:
        return TensorDataset(x, torch.randint(0, 3, (n,), generator=g))
    with torch.no_grad():
        return TensorDataset(x, backbone(pixel_values=x).logits.argmax(-1))


def vit_sop(mode: str = "drop", dropout: float = 0.0, **kwargs) -> sopfast.SOP:
    model = sopfast.SOP(make_hf_vit(), num_groups=4, mode=mode, **kwargs)
    for module in model.projection.modules():
        if isinstance(module, nn.Dropout):
            module.p = dropout
    return model


def collect(event: str, into: list):
    return lambda trainer, ev, record: into.append(record) if ev == event else None


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_loss_decreases(mode):
    backbone = make_hf_vit()
    with torch.no_grad():
        backbone.classifier.weight.mul_(10)  # confident backbone logits: a clearly learnable target
    data = image_data(4, backbone=backbone)
    model = sopfast.SOP(backbone, num_groups=4, mode=mode)
    logs: list = []
    train(
        model,
        data,
        epochs=5,
        lr=1e-3,
        batch_size=4,
        schedule="constant",
        log_every=1,
        progress=False,
        callbacks=[collect("log", logs)],
    )
    losses = [r["loss"] for r in logs]
    assert len(losses) == 5
    # learns (the default recipe's diversity and saliency terms make single steps tick up: no strict minimum)
    assert losses[-1] < 0.85 * losses[0] and max(losses[-2:]) < min(losses[:2]), losses
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in logs)


def test_gradients_reach_every_trainable_part():
    model = vit_sop("exact")
    x, y = image_data(4).tensors
    model.train()
    model(x).loss(y).backward()
    for part in ("projection", "generator", "selector"):
        grads = [p.grad for p in getattr(model, part).parameters() if p.requires_grad]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads), part
        assert sum(g.abs().sum() for g in grads) > 0, part
    assert all(p.grad is None for p in model.backbone.parameters())


class Kill(Exception):
    pass


def kill_at(step: int):
    def callback(trainer, event, record):
        if event == "step" and record["step"] == step:
            raise Kill

    return callback


RESUME_RUN = dict(
    epochs=2,
    lr=1e-3,
    batch_size=2,
    grad_accum=2,
    warmup_steps=2,
    save_every=2,
    eval_every=2,
    log_every=1,
    progress=False,
)


def resume_setup(tmp_path, name):
    return vit_sop(dropout=0.1), image_data(12, seed=1), image_data(4, seed=2), tmp_path / name


def test_resume_equals_uninterrupted(tmp_path):
    model, data, val, out = resume_setup(tmp_path, "straight")
    result = train(model, data, val, output_dir=out, **RESUME_RUN)
    assert (result.step, result.epoch) == (6, 2)  # 12 examples / 2 per batch / 2 per step = 3 steps per epoch
    expected = trainable_state_dict(model)

    model, data, val, out = resume_setup(tmp_path, "killed")
    assert train(model, data, val, output_dir=out, max_steps=1, **RESUME_RUN).step == 1  # stops mid-epoch 0
    model, data, val, _ = resume_setup(tmp_path, "killed")
    with pytest.raises(Kill):  # killed at step 5; the last save was at step 4, mid-epoch 1
        train(model, data, val, output_dir=out, callbacks=[kill_at(5)], **RESUME_RUN)
    state = load_training_state(out / STATE_NAME)
    assert (state["step"], state["epoch"], state["batches_done"]) == (4, 1, 2)
    model, data, val, _ = resume_setup(tmp_path, "killed")
    assert train(model, data, val, output_dir=out, **RESUME_RUN).step == 6

    got = trainable_state_dict(model)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_outputs_logs_and_best_checkpoint(tmp_path):
    model = vit_sop()
    heads: list = []  # model.epoch picks the generator head in training

    def record_head(trainer, event, record):
        if event == "step":
            heads.append(trainer.model.epoch)

    result = train(
        model,
        image_data(8),
        image_data(4, seed=3),
        epochs=2,
        lr=1e-3,
        batch_size=4,
        eval_every=1,
        log_every=1,
        output_dir=tmp_path,
        progress=False,
        callbacks=[record_head],
    )
    assert heads == [0, 0, 1, 1]
    expected = {
        "best",
        "last",
        "log.jsonl",
        STATE_NAME,
        "metrics.csv",
        "training_curves.png",
        "config.yaml",
        "diagnosis.json",
    }
    assert {p.name for p in tmp_path.iterdir()} - {"tensorboard"} == expected
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records].count("train") == 4
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [1, 2, 3, 4]
    best = max(evals, key=lambda r: (r["val_accuracy"], -r["step"]))
    assert (result.best_metric, result.best_step) == (best["val_accuracy"], best["step"])
    assert records[-1]["event"] == "end"
    reloaded = sopfast.SOP.from_pretrained(tmp_path / "last", model.backbone)
    assert all(
        torch.equal(a, b) for a, b in zip(trainable_state_dict(reloaded).values(), trainable_state_dict(model).values())
    )


def test_text_batches_with_accumulation_and_bf16():
    ids, mask, types = text_batch()

    class Text(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {
                "input_ids": ids[i],
                "attention_mask": mask[i],
                "token_type_ids": types[i],
                "labels": torch.tensor(i % 2),
            }

    model = sopfast.SOP(make_bert(), num_groups=2, mode="drop")
    before = trainable_state_dict(model)
    result = train(model, Text(), Text(), epochs=1, batch_size=2, grad_accum=2, amp="bf16", lr=1e-3, progress=False)
    assert result.step == 1 and set(result.metrics) == {
        "val_loss",
        "val_accuracy",
        "val_agreement",
        "val_distinct_groups",
    }
    after = trainable_state_dict(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_regression_uses_mse():
    model = sopfast.SOP(make_hf_vit(num_labels=1), num_groups=4, mode="drop", task="regression")
    x = image_data(4).tensors[0]
    data = TensorDataset(x, torch.randn(4))
    result = train(model, data, data, epochs=1, batch_size=2, progress=False)
    assert (
        set(result.metrics) == {"val_loss", "val_mse", "val_distinct_groups"}
        and result.best_metric == result.metrics["val_mse"]
    )


def test_lr_schedules():
    cosine = lr_factor("cosine", warmup=2, total=10)
    assert [cosine(s) for s in range(3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert cosine(9) == pytest.approx(0.5 * (1 + math.cos(math.pi * 7 / 8))) and cosine(10) == pytest.approx(0)
    inv = lr_factor("inverse_sqrt", warmup=4, total=100)
    assert inv(4) == 1.0 and inv(16) == pytest.approx(0.5)
    assert lr_factor("constant", warmup=0, total=5)(3) == 1.0


@pytest.mark.parametrize(
    "options, match",
    [
        ({"epochs": 0}, "epochs"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -1e-3}, "lr"),
        ({"schedule": "linear"}, "schedule"),
        ({"amp": "fp8"}, "amp"),
        ({"metric": "f1"}, "metric"),
        ({"grad_accum": 0}, "grad_accum"),
        ({"grad_clip": 0}, "grad_clip"),
        ({"warmup_steps": 3, "warmup_ratio": 0.1}, "warmup"),
        ({"lr": math.inf}, "lr must be a finite number > 0.0 and ≤ 1.0 or None, got inf"),
        ({"lr": 1e6}, "lr must be a finite number > 0.0 and ≤ 1.0 or None, got 1000000.0"),
        ({"lr": math.nan}, "lr must be a finite number"),
        ({"weight_decay": math.inf}, "weight_decay must be a finite number"),
        ({"warmup_ratio": math.nan}, "warmup_ratio must be a finite number"),
        ({"grad_clip": math.inf}, "grad_clip must be a finite number"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**options)


def test_bad_arguments(tmp_path):
    model = vit_sop()
    data = image_data(4)
    with pytest.raises(ValueError, match="classification"):
        train(model, data, batch_size=2, metric="mse")
    with pytest.raises(TypeError, match=r"sopfast\.SOP"):
        train(nn.Linear(2, 2), data, batch_size=2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        train(model, data, batch_size=2, epoch=2)
    with pytest.raises(FileNotFoundError, match="no training state"):
        train(model, data, batch_size=2, resume=tmp_path / "missing", progress=False)


def test_bad_option_types():
    with pytest.raises(TypeError, match="progress must be True or False"):
        TrainConfig(progress="no")
    with pytest.raises(TypeError, match="lr must be a finite number"):
        TrainConfig(lr="1e-3")


def poison_at(step: int, part: str = "selector"):
    """A callback that sets the selector's queries (or the generator's weights) to NaN after ``step``."""

    def callback(trainer, event, record):
        if event == "step" and record["step"] == step:
            with torch.no_grad():
                for p in getattr(trainer.model, part).parameters():
                    p.fill_(math.nan)

    return callback


@pytest.mark.parametrize("eval_every", [1, None])
def test_non_finite_loss_stops_training_and_keeps_best(tmp_path, eval_every):
    """A NaN loss stops the run naming the step; best/ and the training state keep finite weights."""
    model = vit_sop()
    loader = torch.utils.data.DataLoader(image_data(8), batch_size=2)
    val = torch.utils.data.DataLoader(image_data(4), batch_size=2)
    options = dict(output_dir=tmp_path, eval_every=eval_every, save_every=1, log_every=5, progress=False)
    with pytest.raises(NonFiniteLossError, match=r"at step 3 .* nothing after step 2 was saved"):
        train(model, loader, val, callbacks=[poison_at(2)], **options)
    state = load_training_state(tmp_path / STATE_NAME)
    assert state["step"] == 2 and all(torch.isfinite(t).all() for t in state["model"].values())
    if eval_every == 1:
        best = sopfast.SOP.from_pretrained(tmp_path / "best", model.backbone)
        assert all(torch.isfinite(t).all() for t in trainable_state_dict(best).values())
    assert not (tmp_path / "last").exists()


def test_a_diverged_generator_stops_training_naming_the_step(tmp_path):
    loader = torch.utils.data.DataLoader(image_data(8), batch_size=2)
    diverged = r"training step 3 \(epoch 1\): the weights \[.*'generator.heads.0'\] became NaN or infinite after 2"
    with pytest.raises(NonFiniteLossError, match=diverged):
        train(vit_sop(), loader, output_dir=tmp_path, callbacks=[poison_at(2, "generator")], progress=False)


def test_infinite_lr_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="lr must be a finite number"):
        train(vit_sop(), image_data(4), batch_size=2, lr=math.inf, output_dir=tmp_path)
    assert not (tmp_path / "best").exists()


def test_resume_with_other_settings_is_refused(tmp_path):
    model, data = vit_sop(), image_data(4)
    train(model, data, batch_size=2, output_dir=tmp_path, max_steps=1, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        train(model, data, batch_size=4, output_dir=tmp_path, progress=False)
    train(model, data, batch_size=4, output_dir=tmp_path, resume=False, max_steps=1, progress=False)  # starts afresh


def test_cli_options_round_trip():
    """The train command's flags give exactly the keyword arguments of sopfast.train."""
    from sopfast.cli import build_parser
    from sopfast.cli.commands.train import training_options

    parser = build_parser().subcommands["train"]
    flags = ["--epochs", "3", "--lr", "1e-4", "--grad-clip", "none", "--no-resume", "--amp", "bf16"]
    args = parser.parse_args(["--backbone", "x", *flags, "--output-dir", "runs/x", "--no-progress", "--seed", "7"])
    config = TrainConfig(**training_options(args))
    assert (config.epochs, config.lr, config.grad_clip, config.resume, config.amp, config.progress, config.seed) == (
        3,
        1e-4,
        None,
        False,
        "bf16",
        False,
        7,
    )
    assert config.batch_size == 32 and config.schedule == TrainConfig.schedule  # unset flags: the API's defaults
    resumed = parser.parse_args(["--backbone", "x", "--resume-from", "state.pt"])
    assert training_options(resumed)["resume"] == "state.pt"


def test_callback_can_stop_training(tmp_path):
    def stop(trainer, event, record):
        trainer.should_stop = True

    result = train(vit_sop(), image_data(8), batch_size=2, output_dir=tmp_path, callbacks=[stop], progress=False)
    assert result.step == 1 and load_training_state(tmp_path)["batches_done"] == 1


def test_head_phases_follow_the_authors_schedule():
    """num_heads=2, 4 steps: head 0 trains in steps 0-1, head 1 in steps 2-3; the LR warms up in each phase."""
    model = vit_sop("exact", num_heads=2)
    start = [w.detach().clone() for w in model.generator.heads]
    seen: list = []
    snapshots: list = []

    def record(trainer, event, rec):
        if event == "step":
            seen.append((trainer.step, trainer.model.epoch, rec["lr"]))
            snapshots.append([w.detach().clone() for w in trainer.model.generator.heads])

    train(
        model,
        image_data(8),
        epochs=1,
        lr=1e-2,
        batch_size=2,
        warmup_steps=1,
        schedule="cosine",
        progress=False,
        callbacks=[record],
    )
    assert [epoch for _, epoch, _ in seen] == [0, 0, 1, 1]
    after_phase0 = snapshots[1]
    assert not torch.equal(after_phase0[0], start[0]) and torch.equal(after_phase0[1], start[1])
    assert torch.equal(snapshots[3][0], after_phase0[0]) and not torch.equal(snapshots[3][1], start[1])
    assert lr_factor("cosine", 1, 2, period=2)(2) == lr_factor("cosine", 1, 2, period=2)(0) == 0.5


def test_epoch_head_schedule_uses_epoch_mod_heads():
    model = vit_sop("exact", num_heads=2)
    heads: list = []
    train(
        model,
        image_data(4),
        epochs=2,
        lr=1e-3,
        batch_size=2,
        head_schedule="epochs",
        progress=False,
        callbacks=[lambda t, ev, rec: heads.append(t.model.epoch) if ev == "step" else None],
    )
    assert heads == [0, 0, 1, 1]


def test_resume_state_outside_the_epoch_is_refused_and_stale_temp_files_go(tmp_path):
    model, data = vit_sop(), image_data(4)
    train(model, data, batch_size=2, output_dir=tmp_path, max_steps=1, progress=False)
    state = load_training_state(tmp_path / STATE_NAME)
    state["batches_done"] = 7  # past the 2 batches of an epoch: would loop forever
    save_training_state(state, tmp_path / STATE_NAME)  # sealed: only the position is wrong
    stale = tmp_path / f".{STATE_NAME}.999999999.0123abcd.tmp"
    stale.write_bytes(b"partial state")
    with pytest.raises(ValueError, match=r"is not inside an epoch of 2 batches"):
        train(model, data, batch_size=2, output_dir=tmp_path, progress=False)
    assert not stale.exists()
