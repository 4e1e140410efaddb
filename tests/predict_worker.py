"""Run by tests/test_predict.py in a subprocess (alone, or under ``torchrun``): ``sopfast.predict`` of a
tiny SOP over seeded tensors into ``--out``; ``--hang-writing S`` writes half of shard ``S``'s file and
then waits to be killed (a crash in the middle of a write)."""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import TensorDataset

import sopfast
from sopfast.prediction import store
from sopfast.testing import make_hf_vit

EXAMPLES, BATCH, SHARD = 22, 3, 4


def make_model() -> sopfast.SOP:
    """In eval mode, as ``predict`` runs it (in training the default recipe draws its groups with noise)."""
    return sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25, mode="drop").eval()


def make_data(n: int = EXAMPLES) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 3, (n,), generator=g))


def run(out: str) -> sopfast.PredictResult:
    return sopfast.predict(
        make_model(), make_data(), out, batch_size=BATCH, shard_size=SHARD, device="cpu", progress=False
    )


def _hang_writing(shard: int) -> None:
    write = store.OutputDir.write_shard

    def half_then_hang(self, index, table, skipped):
        if index != shard:
            return write(self, index, table, skipped)
        import pyarrow.parquet as pq

        path = self.shard_path(index)  # the temporary file atomic_write fills before renaming it
        temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.0123abcd.tmp")
        pq.write_table(table, temporary)
        os.truncate(temporary, os.path.getsize(temporary) // 2)
        print("hanging", flush=True)
        time.sleep(600)

    store.OutputDir.write_shard = half_then_hang


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--hang-writing", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.hang_writing is not None:
        _hang_writing(args.hang_writing)
    run(args.out)


if __name__ == "__main__":
    main()
