"""Helpers for training under ``torchrun`` (DistributedDataParallel) and resumable data loading.

``torchrun --nproc_per_node=N script.py`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
:func:`init_distributed` then joins the process group (NCCL for CUDA, gloo for CPU).  Without
those variables everything runs as a single process (rank 0 of 1).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sized
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: ``rank`` of ``world_size``; ``owns_group`` if we started the group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def init_distributed(device_type: str | None = None) -> DistInfo:
    """Join the process group ``torchrun`` describes (if any); a no-op in a single process.

    ``device_type`` picks the backend: ``"cuda"`` → NCCL, anything else → gloo (``None``:
    NCCL when CUDA is available).
    """
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", 0))
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return DistInfo()
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    local_rank = _env_int("LOCAL_RANK", 0)
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, owns_group=True)


def cleanup(info: DistInfo) -> None:
    """Leave the process group if :func:`init_distributed` created it."""
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place (a no-op in a single process)."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def wrap_ddp(model: nn.Module, device: torch.device, info: DistInfo, find_unused_parameters: bool) -> nn.Module:
    """``DistributedDataParallel(model)`` under torchrun, else ``model`` itself."""
    if not info.enabled:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters)


def no_sync(model: nn.Module, skip: bool) -> AbstractContextManager:
    """DDP's ``no_sync()`` (gradient accumulation without all-reduce) when ``skip``."""
    if skip and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return nullcontext()


class ResumableSampler(DistributedSampler):
    """A seeded :class:`DistributedSampler` that can start part-way through an epoch.

    The order of epoch ``e`` is ``randperm(n, seed + e)`` split over ranks; ``start`` skips
    that many of this rank's samples (set it to ``batches_done · batch_size`` to resume).
    """

    def __init__(self, dataset: Dataset, info: DistInfo, *, shuffle: bool, seed: int):
        super().__init__(dataset, num_replicas=info.world_size, rank=info.rank, shuffle=shuffle, seed=seed)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


def rebuildable(loader: DataLoader) -> bool:
    """Whether ``loader`` uses a plain random/sequential sampler we can swap for a seeded, sharded one."""
    return (
        not isinstance(loader.dataset, IterableDataset)
        and type(loader.batch_sampler) is BatchSampler
        and type(loader.sampler) in (RandomSampler, SequentialSampler)
    )


def _loader_options(loader: DataLoader) -> dict:
    return {
        "batch_size": loader.batch_size,
        "collate_fn": loader.collate_fn,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "persistent_workers": loader.persistent_workers,
    }


def num_train_batches(loader: DataLoader) -> int:
    """The batches of one epoch of the train ``loader`` (TypeError without a length, ValueError when none)."""
    try:
        n = len(loader)
    except TypeError as err:
        raise TypeError("train_data must have a length (a map-style Dataset or a DataLoader over one)") from err
    if n == 0:
        raise ValueError("train_data yields no batches")
    return n


def make_train_loader(data: Dataset | DataLoader, batch_size: int | None, info: DistInfo, seed: int) -> DataLoader:
    """A loader with a :class:`ResumableSampler` (shuffled for datasets and shuffling loaders).

    A DataLoader with a custom sampler is returned as is (it must shard itself under DDP).
    """
    if isinstance(data, DataLoader):
        if not rebuildable(data):
            if info.enabled and not isinstance(data.sampler, DistributedSampler):
                warnings.warn(
                    "train_data has a custom sampler that does not shard: every rank sees all batches",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return data
        options, shuffle, dataset = _loader_options(data), isinstance(data.sampler, RandomSampler), data.dataset
    else:
        options, shuffle, dataset = {"batch_size": batch_size}, True, data
    sampler = ResumableSampler(dataset, info, shuffle=shuffle, seed=seed)
    return DataLoader(dataset, sampler=sampler, generator=torch.Generator().manual_seed(seed), **options)


def make_eval_loader(data: Dataset | DataLoader, batch_size: int | None, info: DistInfo) -> DataLoader:
    """A loader over this rank's share (every ``world_size``-th example, no padding) of ``data``."""
    if isinstance(data, DataLoader):
        if not (info.enabled and rebuildable(data)):
            return data
        options, dataset = _loader_options(data), data.dataset
    else:
        options, dataset = {"batch_size": batch_size}, data
    if info.enabled:
        if not isinstance(dataset, Sized):
            raise TypeError(f"evaluation data must be a dataset with a length, got {type(dataset).__name__}")
        dataset = Subset(dataset, range(info.rank, len(dataset), info.world_size))
    options["drop_last"] = False
    return DataLoader(dataset, shuffle=False, **options)
