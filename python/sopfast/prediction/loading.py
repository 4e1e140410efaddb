"""The examples of a prediction run: which shard holds which example ids, which shards a process
owns under ``torchrun``, and the loader that reads them (unreadable examples reported, not fatal)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from ..data.datasets import take


@dataclass(frozen=True)
class ShardPlan:
    """``examples`` ids cut into shards of ``shard_size`` consecutive ids: shard ``s`` holds the ids
    ``s·shard_size …`` (the last one fewer).  Under ``world`` processes, process ``rank`` owns the
    shards ``s ≡ rank (mod world)``: disjoint shares fixed by the numbers alone."""

    examples: int
    shard_size: int

    @property
    def shards(self) -> int:
        return -(-self.examples // self.shard_size)

    def ids(self, shard: int) -> range:
        """The example ids of ``shard``."""
        start = shard * self.shard_size
        return range(start, min(start + self.shard_size, self.examples))

    def shard_of(self, example: int) -> int:
        return example // self.shard_size

    def owned(self, rank: int, world: int) -> list[int]:
        """The shards process ``rank`` of ``world`` writes."""
        return list(range(rank, self.shards, world))


@dataclass
class Skipped:
    """An example that could not be read: its id, where it comes from, and why."""

    id: int
    source: str | None
    error: str


def example_sources(dataset: Any, indices: Sequence[int]) -> list[str | None]:
    """Where the examples ``indices`` come from, when the dataset says (an image file's path), else ``None``."""
    sources = getattr(dataset, "sources", None)
    if sources is None:
        return [None] * len(indices)
    return [_path(source) for source in take(sources, indices)]


def _path(source: Any) -> str | None:
    if isinstance(source, dict):
        source = source.get("path")
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else None


Item = tuple[int, Any, "str | None", "str | None"]


class _Items(Dataset):
    """``dataset[i]`` as ``(i, item, source, error)``: a read that fails with ``OSError`` or
    ``ValueError`` (an unreadable file, a bad value) gives ``item None`` and the error's first line.
    A batch is read at once where the dataset can (``__getitems__``), else (or when one of its
    examples fails) one example at a time."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Item:
        return self._one(index, example_sources(self.dataset, [index])[0])

    def __getitems__(self, indices: Sequence[int]) -> list[Item]:
        sources = example_sources(self.dataset, indices)
        fetch = getattr(self.dataset, "__getitems__", None)
        if fetch is not None:
            try:
                return [(i, item, s, None) for i, item, s in zip(indices, fetch(list(indices)), sources)]
            except (OSError, ValueError):
                pass  # an example that cannot be read: find it below
        return [self._one(i, s) for i, s in zip(indices, sources)]

    def _one(self, index: int, source: str | None) -> Item:
        try:
            return index, self.dataset[index], source, None
        except (OSError, ValueError) as err:
            return index, None, source, (str(err).strip().splitlines() or [type(err).__name__])[0]


class LoadedBatch(NamedTuple):
    """What the loader gives: the ``ids`` and ``sources`` of the readable examples, their collated
    ``batch`` (``None`` when none could be read) and the examples ``skipped`` (a named tuple, so
    ``pin_memory`` pins the batch's tensors)."""

    ids: list[int]
    sources: list[str | None]
    batch: Any
    skipped: list[Skipped]


def _collate(items: Sequence[Item]) -> LoadedBatch:
    good = [item for item in items if item[3] is None]
    skipped = [Skipped(i, source, error) for i, _, source, error in items if error is not None]
    batch = torch.utils.data.default_collate([item[1] for item in good]) if good else None
    return LoadedBatch([item[0] for item in good], [item[2] for item in good], batch, skipped)


class ShardBatches(Sampler[list[int]]):
    """Batches of ``batch_size`` ids over ``shards`` in order; a batch never spans two shards, so
    every shard is computed in the same batches whichever process or run writes it."""

    def __init__(self, plan: ShardPlan, shards: Sequence[int], batch_size: int):
        self.plan, self.shards, self.batch_size = plan, list(shards), batch_size

    def __iter__(self) -> Iterator[list[int]]:
        for shard in self.shards:
            ids = self.plan.ids(shard)
            for start in range(0, len(ids), self.batch_size):
                yield list(ids[start : start + self.batch_size])

    def __len__(self) -> int:
        return sum(-(-len(self.plan.ids(s)) // self.batch_size) for s in self.shards)


def read_example(dataset: Dataset, index: int) -> tuple[Any, str | None]:
    """Example ``index`` and ``None``, or ``None`` and why it cannot be read."""
    _, item, _, error = _Items(dataset)[index]
    return item, error


def check_dataset(dataset: Any) -> None:
    """A TypeError naming ``dataset`` unless it is map-style (``len(dataset)``, ``dataset[i]``; not a
    generator, an ``IterableDataset`` or a string), a ValueError when it is empty."""
    if isinstance(dataset, (IterableDataset, str, bytes)) or not (
        isinstance(dataset, Sized) and hasattr(dataset, "__getitem__")
    ):
        raise TypeError(
            f"dataset must be a map-style dataset (len(dataset) and dataset[i], e.g. a list or a torch "
            f"Dataset), got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError("dataset is empty: nothing to predict")


def make_loader(
    dataset: Dataset, plan: ShardPlan, shards: Sequence[int], batch_size: int, num_workers: int, pin_memory: bool
) -> DataLoader:
    """A loader of :class:`LoadedBatch` es over the ids of ``shards`` (:class:`ShardBatches`)."""
    return DataLoader(
        _Items(dataset),
        batch_sampler=ShardBatches(plan, shards, batch_size),
        num_workers=num_workers,
        collate_fn=_collate,
        pin_memory=pin_memory,
    )
