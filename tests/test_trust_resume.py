"""Resuming only the same run, and never saving a model that cannot run (issue #31): the fingerprint
holds the model options, the training options and the data's identity; a state lacking an entry or
holding NaN is refused; weights and optimizer state are checked before each save."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

import sopfast
from sopfast.data.identity import data_identity
from sopfast.model.checkpoint import STATE_NAME, load_training_state, save_training_state
from sopfast.testing import make_hf_vit
from sopfast.training import NonFiniteLossError, train

RUN = dict(batch_size=2, max_steps=1, progress=False, log_every=1)


def data(seed: int = 0, n: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 3, (n,), generator=g))


def model(**options) -> sopfast.SOP:
    return sopfast.SOP(make_hf_vit(), **{"num_groups": 4, **options})


@pytest.fixture
def run(tmp_path):
    """A run folder with the training state of one step (num_groups 4, tau 0.2, data(0))."""
    train(model(), data(), output_dir=tmp_path, **RUN)
    return tmp_path


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(options={"num_groups": 5}), r"num_groups \(--num-groups\): 4 → 5"),
        (dict(options={"tau": 0.25}), r"tau \(--tau\): 0.2 → 0.25"),
        (dict(options={"recipe": "paper"}), r"recipe \(--recipe\): 'sopfast' → 'paper'"),
        (dict(data=data(seed=1)), r"the training data \(--data.*4 examples, sha256 \w+… of tensors → 4 examples"),
        (dict(train={"weight_decay": 0.1}), r"weight_decay \(--weight-decay\): 0.01 → 0.1"),
        (dict(train={"grad_clip": None}), r"grad_clip \(--grad-clip\): 1.0 → None"),
        (dict(train={"amp": "bf16"}), r"amp \(--amp\): None → 'bf16'"),
    ],
)
def test_resume_refuses_another_run_naming_the_difference_and_the_flag(run, change, match):
    with pytest.raises(ValueError, match=match + r".*start afresh with resume=False \(--no-resume\)"):
        train(
            model(**change.get("options", {})),
            change.get("data", data()),
            output_dir=run,
            **{**RUN, **change.get("train", {})},
        )


def test_the_same_run_resumes_and_a_finished_one_with_other_options_is_refused(run):
    assert train(model(), data(), output_dir=run, **{**RUN, "max_steps": 2}).step == 2
    with pytest.raises(ValueError, match=r"tau \(--tau\): 0.2 → 0.3"):
        train(model(tau=0.3), data(), output_dir=run, **{**RUN, "max_steps": 2})


def test_a_state_lacking_an_entry_is_refused_naming_it(run):
    state = load_training_state(run / STATE_NAME)
    del state["rng"]["numpy"], state["optimizer"]
    save_training_state(state, run / STATE_NAME)
    with pytest.raises(ValueError, match=r"lacks \['optimizer', 'rng.numpy'\]; start afresh"):
        train(model(), data(), output_dir=run, **RUN)


def test_a_state_with_nan_in_the_optimizer_is_refused(run):
    state = load_training_state(run / STATE_NAME)
    next(iter(state["optimizer"]["state"].values()))["exp_avg"].fill_(math.nan)
    save_training_state(state, run / STATE_NAME)
    with pytest.raises(ValueError, match=r"optimizer state holds NaN or infinite values in \['state\.0\.exp_avg'\]"):
        train(model(), data(), output_dir=run, **RUN)


def test_a_training_state_of_0_3_0_resumes(run):
    """0.3.0 wrote no checksum and a fingerprint without model options or data identity."""
    state = load_training_state(run / STATE_NAME)
    del state["sha256"], state["sopfast_version"]
    state["fingerprint"] = {k: v for k, v in state["fingerprint"].items() if "." not in k and k != "data"}
    torch.save(state, run / STATE_NAME)
    assert train(model(), data(), output_dir=run, **{**RUN, "max_steps": 2}).step == 2


class PoisonOptimizer(sopfast.TrainerCallback):
    """Sets the optimizer's ``exp_avg`` to NaN after step 1."""

    def on_step_end(self, trainer, record):
        if record["step"] == 1:
            for state in trainer.optimizer.state.values():
                state["exp_avg"].fill_(math.nan)


def test_nan_optimizer_state_is_never_saved(tmp_path):
    with pytest.raises(NonFiniteLossError, match=r"training stopped at step 2 \(lr 0.001\): NaN or infinite values in"):
        train(
            model(),
            data(n=8),
            output_dir=tmp_path,
            callbacks=[PoisonOptimizer()],
            **{**RUN, "max_steps": None, "save_every": 1},
        )
    state = load_training_state(tmp_path / STATE_NAME)
    assert state["step"] == 1 and not (tmp_path / "last").exists()


def test_data_identity_says_what_it_hashed(monkeypatch):
    tensors = data()
    assert data_identity(tensors) == data_identity(DataLoader(data(), batch_size=2))
    assert data_identity(tensors)["basis"] == "tensors"
    assert data_identity(Subset(tensors, [0, 1]))["basis"] == "tensors, subset indices"
    assert data_identity(Subset(tensors, [0, 1]))["sha256"] != data_identity(Subset(tensors, [1, 0]))["sha256"]
    assert data_identity([1, 2, 3]) == {
        "examples": 3,
        "sha256": data_identity([4, 5, 6])["sha256"],
        "basis": "count only (list names no examples)",
    }
    monkeypatch.setattr("sopfast.data.identity.FULL_HASH_BYTES", 100)  # larger than this: shapes and rows
    assert data_identity(tensors)["basis"] == "tensor shapes and 4 rows"

    class Named(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def identity(self):
            return "v1"

    assert data_identity(Named())["basis"] == "Named.identity()"
