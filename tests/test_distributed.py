"""DDP under torchrun (2 CPU processes, gloo) and the resumable, sharded sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ddp_worker import RUN, make_data, make_model
from torch.utils.data import DataLoader, TensorDataset

import sopfast
from sopfast.model.checkpoint import trainable_state_dict
from sopfast.testing import make_cnn
from sopfast.training.distributed import DistInfo, ResumableSampler, make_eval_loader, make_train_loader
from sopfast.training.trainer import Trainer, train
from sopfast.training.validation import has_unused_parameters

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def read_log(path: Path, event: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == event]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
@pytest.mark.parametrize("recipe", ["paper", "sopfast"])
def test_two_processes_match_one(tmp_path, recipe):
    """Same losses, metrics and weights as one process with the whole batch.  The default recipe's
    weights are compared to one learning-rate step: its centred embeddings cancel any shift shared by
    every token, so biases such as the projection's last MLP bias get gradients of ~1e-8 (noise), which
    AdamW turns into updates of up to ±lr."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(TESTS / "ddp_worker.py"),
        "--out",
        str(tmp_path),
        "--batch-size",
        "2",
        "--recipe",
        recipe,
    ]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert all(torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k]) for k in ranks[0]["weights"])

    model = make_model(recipe)  # one process, the same global batch (2 ranks × 2)
    result = train(model, make_data(8, 0), make_data(6, 1), batch_size=4, output_dir=tmp_path / "single", **RUN)
    assert ranks[0]["step"] == result.step == 4
    ddp_losses = [r["loss"] for r in read_log(tmp_path / "run" / "log.jsonl", "train")]
    single_losses = [r["loss"] for r in read_log(tmp_path / "single" / "log.jsonl", "train")]
    assert len(ddp_losses) == 4  # rank 0 alone writes the log
    assert ddp_losses == pytest.approx(single_losses, abs=1e-5)
    assert ranks[0]["metrics"] == pytest.approx(result.metrics, abs=1e-5)
    single = trainable_state_dict(model)
    atol = 1e-5 if recipe == "paper" else RUN["lr"]
    for name, tensor in ranks[0]["weights"].items():
        torch.testing.assert_close(tensor, single[name], atol=atol, rtol=1e-4, msg=name)


def test_sampler_shards_a_seeded_permutation_and_resumes():
    data = list(range(10))
    shards = [list(ResumableSampler(data, DistInfo(rank=r, world_size=2), shuffle=True, seed=5)) for r in range(2)]
    whole = list(ResumableSampler(data, DistInfo(), shuffle=True, seed=5))
    assert sorted(whole) == data and [whole[0::2], whole[1::2]] == shards
    sampler = ResumableSampler(data, DistInfo(), shuffle=True, seed=5)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != whole
    sampler.start = 4
    assert list(sampler) == epoch1[4:] and len(sampler) == 6


def test_loaders_keep_user_settings_and_shard_evaluation():
    data = list(range(7))
    loader = DataLoader(data, batch_size=3, shuffle=True, drop_last=True)
    rebuilt = make_train_loader(loader, None, DistInfo(), seed=0)
    assert isinstance(rebuilt.sampler, ResumableSampler) and rebuilt.sampler.shuffle
    assert rebuilt.batch_size == 3 and len(rebuilt) == 2
    shares = [[int(i) for b in make_eval_loader(data, 2, DistInfo(rank=r, world_size=2)) for i in b] for r in range(2)]
    assert shares == [[0, 2, 4, 6], [1, 3, 5]]


@pytest.mark.parametrize("family, unused", [("cnn", True), ("vit", False)])
def test_probe_for_unused_parameters(family, unused):
    if family == "cnn":
        model = sopfast.SOP(make_cnn(), num_groups=3, feature_layer="features")
        data = TensorDataset(torch.randn(4, 3, 16, 16), torch.randint(0, 3, (4,)))
    else:
        model, data = make_model(), make_data(4, 0)
    trainer = Trainer(model, data, batch_size=2, progress=False, diagnose=False)
    trainer.info = DistInfo()
    trainer._setup()
    rng, weights = torch.get_rng_state(), trainable_state_dict(model)
    batch = next(iter(trainer.train_loader))
    assert has_unused_parameters(model, batch, trainer.device, trainer._autocast) is unused
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(t, weights[k]) for k, t in trainable_state_dict(model).items())
