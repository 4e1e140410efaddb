"""Run by tests/test_distributed.py under ``torchrun``: train a tiny SOP and save each rank's weights."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import sopfast
from sopfast.model.checkpoint import trainable_state_dict
from sopfast.testing import make_hf_vit
from sopfast.training.trainer import train

RUN = dict(epochs=2, lr=1e-3, warmup_steps=1, log_every=1, eval_every=2, progress=False, device="cpu", seed=3)


def make_model(recipe: str = "sopfast") -> sopfast.SOP:
    """Exploration off: each rank draws its own noise, so with it DDP equals one process only in distribution."""
    return sopfast.SOP(make_hf_vit(), num_groups=4, mode="drop", recipe=recipe, explore=0.0)


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 3, (n,), generator=g))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--recipe", default="sopfast")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = make_model(args.recipe)
    result = train(
        model, make_data(8, 0), make_data(6, 1), batch_size=args.batch_size, output_dir=args.out / "run", **RUN
    )
    rank = int(os.environ["RANK"])
    torch.save(
        {"weights": trainable_state_dict(model), "metrics": result.metrics, "step": result.step},
        args.out / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main()
