"""One split of ``--data`` for a model: a built-in dataset or your own files, preprocessed for the
backbone, its first example checked to make a batch the model takes."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch

from ..adapters.base import BackboneAdapter
from ..adapters.preprocessing import preprocessing_for
from ..adapters.sources import Backbone
from ..defaults import HOLDOUT
from .batches import parse_batch
from .builtin import BUILTIN
from .object_masks import ObjectMasks
from .user_data import Columns, DataError
from .user_data import load_split as load_user_split

logger = logging.getLogger(__name__)


@dataclass
class DataOptions:
    """How to read your own data: columns, the split names, the held-out fraction (``None``: a single
    split whole), preprocessing overrides (``image_size`` N or H W, ``image_mean``/``image_std`` per
    channel, ``max_length`` tokens), the preprocessing a model was trained with (``saved_preprocessing``,
    its ``provenance["preprocessing"]``: it applies where no override is given) and where object masks
    come from (items then ``(x, y, mask)``); ``labels_optional``: data without labels is read unlabelled
    (``sopfast predict``), not refused."""

    columns: Columns | None = None
    train_split: str | None = None
    val_split: str | None = None
    split: str | None = None
    holdout: float | None = HOLDOUT
    image_size: Sequence[int] | None = None
    image_mean: Sequence[float] | None = None
    image_std: Sequence[float] | None = None
    max_length: int | None = None
    object_masks: ObjectMasks | None = None
    saved_preprocessing: dict[str, Any] | None = None
    label_map: dict[Any, Any] | None = None
    labels_optional: bool = False

    def check_modality(self, modality: str) -> None:
        """Options of the other modality are mistakes (they would be ignored): a DataError naming the first."""
        columns = self.columns or Columns()
        image: dict[str, Any] = {
            "image_column": columns.image,
            "image_size": self.image_size,
            "image_mean": self.image_mean,
        }
        image |= {"image_std": self.image_std, "object_masks": self.object_masks}
        text = {"text_column": columns.text, "text_pair_column": columns.text_pair, "max_length": self.max_length}
        other = text if modality == "image" else image
        given = [name for name, value in other.items() if value is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            kind, model = ("text", "an image") if modality == "image" else ("image", "a text")
            raise DataError(f"{given[0]} ({flag}) is for {kind} data; the backbone is {model} model")

    def split_for(self, role: str) -> str | None:
        """The split name asked for ``role`` (``"train"``, ``"val"``, ``"test"``)."""
        return {"train": self.train_split, "val": self.val_split}.get(role, self.split)


@dataclass
class LoadedSplit:
    """A split ready for a model: the ``dataset``, a line saying which split it is, and the
    ``preprocessing`` applied (:meth:`~sopfast.adapters.preprocessing.Preprocessing.describe`; ``None``
    for built-in data, which comes preprocessed)."""

    dataset: torch.utils.data.Dataset
    description: str
    preprocessing: dict[str, Any] | None = None


def load_split(
    data: str,
    role: str,
    adapter: BackboneAdapter,
    source: Backbone,
    options: DataOptions | None = None,
    limit: int | None = None,
) -> LoadedSplit:
    """The split for ``role`` (``"train"``, ``"val"``, ``"test"``) of ``data`` — a name in
    :data:`sopfast.data.builtin.BUILTIN` or a path (image folder, saved Hugging Face dataset, CSV/JSONL;
    an existing path wins over a built-in name: :func:`is_builtin`)
    — for the backbone ``adapter`` wraps, loaded from ``source``.

    Raises :class:`sopfast.data.user_data.DataError` (a ValueError) naming the data and the role when
    the split is empty, has no labels (unless ``options.labels_optional``) or does not fit the
    backbone.
    """
    options = options or DataOptions()
    options.check_modality(adapter.modality)
    loaded = _read(data, role, adapter, source, options, limit)
    dataset = loaded.dataset
    size = len(cast(Sized, dataset))
    if size == 0:
        raise DataError(f"--data {data}: the {role} split is empty")
    batch = parse_batch(torch.utils.data.default_collate(_first_readable(dataset, size, data, role)))
    if batch.x is not None and float(batch.x.float().std()) == 0.0:
        logger.warning("--data %s (%s): the first images are one constant colour after preprocessing", data, role)
    if batch.labels is None and not options.labels_optional:
        raise DataError(f"--data {data}: the {role} examples have no labels")
    try:
        adapter.prepare(**cast(dict[str, Any], batch.adapter_inputs()))
    except (ValueError, TypeError) as err:
        raise DataError(f"--data {data} ({role}) does not fit the backbone: {err}") from err
    return loaded


def _first_readable(dataset: torch.utils.data.Dataset, size: int, data: str, role: str, count: int = 8) -> list[Any]:
    """The first ``count`` examples that can be read (an unreadable file is for the command to skip or
    report); DataError when none can."""
    items, error = [], None
    for i in range(size):
        try:
            items.append(dataset[i])
        except DataError as err:
            error = error or err
            continue
        if len(items) == count:
            break
    if not items:
        raise DataError(f"--data {data}: no {role} example can be read ({error})")
    return items


def is_builtin(data: str) -> bool:
    """Whether ``data`` names a built-in dataset (:data:`~sopfast.data.builtin.BUILTIN`): a path that
    exists wins over a built-in name (``--data tweets`` with a folder ``./tweets`` reads the folder, as
    ``datasets.load_dataset`` prefers a local path), with a warning naming both."""
    if data not in BUILTIN:
        return False
    if os.path.exists(data):
        logger.warning(
            "--data %s: reading the local %s %s, not the built-in dataset of that name (rename or move it to "
            "use the built-in one)",
            data,
            "folder" if os.path.isdir(data) else "file",
            os.path.abspath(data),
        )
        return False
    return True


def _read(
    data: str, role: str, adapter: BackboneAdapter, source: Backbone, options: DataOptions, limit: int | None
) -> LoadedSplit:
    modality = adapter.modality
    if is_builtin(data):
        if options.label_map is not None:
            raise DataError(f"label_map (--label-map) is for your own data; --data {data} is built in")
        builtin = BUILTIN[data]
        if builtin.modality != modality:
            article = "an" if modality == "image" else "a"
            raise DataError(f"--data {data} is {builtin.modality} data but the backbone is {article} {modality} model")
        dataset, part = builtin.read(role, limit, source.directory, options.object_masks, options.holdout)
        return LoadedSplit(dataset, f"{role} data: {data}, {part}, {len(cast(Sized, dataset))} examples")
    if not os.path.exists(data):
        raise DataError(
            f"--data {data!r} is neither a built-in dataset ({', '.join(BUILTIN)}) nor an "
            "existing image folder, saved Hugging Face dataset or CSV/JSONL file"
        )
    prep = preprocessing_for(
        adapter,
        source,
        image_size=options.image_size,
        mean=options.image_mean,
        std=options.image_std,
        max_length=options.max_length,
        saved=options.saved_preprocessing,
    )
    dataset, name = load_user_split(
        data,
        role,
        prep,
        columns=options.columns,
        split=options.split_for(role),
        holdout=options.holdout,
        limit=limit,
        object_masks=options.object_masks,
        label_map=options.label_map,
        labels_optional=options.labels_optional,
    )
    return LoadedSplit(dataset, f"{role} data: {data}, split {name}, {len(dataset)} examples", prep.describe())
