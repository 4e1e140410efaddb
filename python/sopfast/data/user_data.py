"""Your own data for the command line (and for scripts): image folders, saved Hugging Face
``datasets``, CSV / JSONL files; preprocessing read from the backbone.

Data sources (:func:`open_source`):

* **image folder** – torchvision ``ImageFolder`` layout, ``root/<class>/<image>``, or one such
  folder per split, ``root/{train,validation,test}/<class>/<image>``;
* **saved Hugging Face dataset** – a directory written by ``Dataset.save_to_disk`` or
  ``DatasetDict.save_to_disk`` (needs the optional ``datasets`` package, ``pip install sopfast[data]``);
* **CSV / TSV / JSONL** – one file, or a directory of ``<split>.csv`` / ``<split>.jsonl`` files; columns
  hold a text (and optionally a second text) or an image path (relative to the file), and a label.

Columns default to the usual names (:data:`IMAGE_COLUMNS`, :data:`TEXT_COLUMNS`,
:data:`LABEL_COLUMNS`); flags name others.  Splits: a source's own ``train`` / ``validation`` /
``test`` splits, chosen by name if wanted; a source with one split is cut into train and a held-out
part (``holdout``, shuffled with a fixed seed so that ``train`` and ``evaluate`` agree).

Labels: integers are class ids; strings are class names, mapped with the backbone's ``label2id``
when it names them all, else in sorted order (for image folders: torchvision's sorted folder order).

Preprocessing (:class:`sopfast.adapters.preprocessing.Preprocessing`) comes from the backbone: see
:func:`sopfast.adapters.preprocessing.preprocessing_for`.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..adapters.preprocessing import Preprocessing
from .datasets import ImageDataset, TextDataset
from .object_masks import ObjectMasks

if TYPE_CHECKING:
    from PIL import Image as PILImage

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TABLE_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".json")
IMAGE_COLUMNS = ("image", "img", "pixel_values", "image_path", "path", "file")
TEXT_COLUMNS = ("text", "sentence", "sentence1", "content", "review", "question", "premise")
PAIR_COLUMNS = {"sentence1": "sentence2", "question": "context", "premise": "hypothesis"}
LABEL_COLUMNS = ("label", "labels", "y", "target", "class")
VALIDATION_SPLITS = ("validation", "val", "valid", "dev")
ROLES = ("train", "val", "test")
HOLDOUT_SEED = 0
# fewer held-out examples of a class than this makes its scores noisy: a warning says so
MIN_HELD_OUT_PER_CLASS = 5
logger = logging.getLogger(__name__)


class DataError(ValueError):
    """Data that cannot be read as asked: the message names the path, column or split."""


# -- sources and splits ----------------------------------------------------------------------------
@dataclass
class Split:
    """One split of a source: ``inputs`` (image sources or texts), optional ``pairs``, raw ``labels``."""

    inputs: Sequence[Any]
    labels: Sequence[Any]
    pairs: Sequence[str] | None = None
    label_names: Sequence[str] | None = None
    masks: Sequence[Any] | None = None

    def take(self, index: Sequence[int]) -> Split:
        pairs = None if self.pairs is None else _Indexed(self.pairs, index)
        masks = None if self.masks is None else _Indexed(self.masks, index)
        return Split(_Indexed(self.inputs, index), _Indexed(self.labels, index), pairs, self.label_names, masks)


class _Indexed(Sequence):
    """``seq[index[i]]``, lazily."""

    def __init__(self, seq: Sequence, index: Sequence[int]):
        # Not ``self.index``: that would hide ``Sequence.index(value)``.
        self.seq, self.positions = seq, list(index)

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.seq[j] for j in self.positions[i]]
        return self.seq[self.positions[i]]


class _Column(Sequence):
    """One column of a Hugging Face dataset, read row by row (images decode on access)."""

    def __init__(self, dataset: Any, column: str):
        self.dataset, self.column = dataset, column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.dataset[int(i)][self.column]


@dataclass
class Source:
    """A data source: named splits (raw until columns are chosen), the directory relative image
    paths start from, and the class folder names of an image folder."""

    path: str
    kind: str
    splits: Mapping[str, Split | _RawSplit]
    base_dir: str = ""
    class_names: Sequence[str] | None = None

    def resolve(self, role: str, name: str | None = None, holdout: float = 0.1) -> tuple[str, Split]:
        """The split for ``role`` (``"train"``, ``"val"``, ``"test"``): ``name`` if given, else the
        source's own split, else the held-out part of a single split."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        available = list(self.splits)
        if name is not None:
            if name not in self.splits:
                raise DataError(f"{self.path} has no split {name!r}; available: {available}")
            return name, self._chosen(name)
        evaluation = [s for s in (*VALIDATION_SPLITS, "test") if s in self.splits]
        if role == "test":
            evaluation = [s for s in ("test", *VALIDATION_SPLITS) if s in self.splits]
        train = "train" if "train" in self.splits else (available[0] if len(available) == 1 else None)
        if role != "train" and evaluation:
            return evaluation[0], self._chosen(evaluation[0])
        if train is None:
            flag = "--train-split" if role == "train" else ("--val-split" if role == "val" else "--split")
            raise DataError(
                f"{self.path} has no {role!r} split and no single split to cut one from; "
                f"available: {available}; name one with {flag}"
            )
        if role == "train" and evaluation:
            return train, self._chosen(train)
        return _holdout(train, self._chosen(train), role, holdout)

    def _chosen(self, name: str) -> Split:
        """Split ``name``, whose columns must be chosen (:func:`load_split` does it before resolving)."""
        split = self.splits[name]
        if not isinstance(split, Split):
            raise TypeError(f"split {name!r} of {self.path} is raw: choose its columns before resolving it")
        return split


def _holdout(name: str, split: Split, role: str, fraction: float) -> tuple[str, Split]:
    """The training or the held-out part of ``split``: a ``fraction`` of each class (stratified where
    every class has two examples or more), shuffled with a fixed seed so every command cuts alike."""
    from sklearn.model_selection import train_test_split

    n = len(split.labels)
    if n < 2:
        raise DataError(f"split {name!r} has {n} example(s): too few to hold out a validation part")
    labels = [str(v) for v in split.labels]
    counts = Counter(labels)
    k = len(counts)
    held = min(n - 1, max(1, round(n * fraction)))
    stratify = labels if min(counts.values()) >= 2 and n >= 2 * k else None
    if stratify is not None:
        held = min(max(held, k), n - k)  # at least one example of every class on each side
    kept, out = train_test_split(list(range(n)), test_size=held, random_state=HOLDOUT_SEED, stratify=stratify)
    how = "stratified" if stratify else "not stratified: too few examples per class"
    if role != "train":
        few = sorted(c for c, k in Counter(labels[i] for i in out).items() if k < MIN_HELD_OUT_PER_CLASS)
        if few or len(set(labels[i] for i in out)) < len(counts):
            logger.warning(
                "the held-out part of %r has %d examples, fewer than %d for classes %s: its scores are noisy "
                "(use more data, a larger --holdout or a split of its own)",
                name,
                held,
                MIN_HELD_OUT_PER_CLASS,
                few[:5] or "missing from it",
            )
    part = kept if role == "train" else out
    label = (
        f"{name}, {'training' if role == 'train' else 'held-out'} part ({len(part)} of {n}, {how}, seed {HOLDOUT_SEED})"
    )
    return label, split.take(sorted(part))


def _image_files(directory: str) -> list[str]:
    files = []
    for root, _, names in os.walk(directory, followlinks=True):
        files += [os.path.join(root, n) for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS)]
    return sorted(files)


def _class_dirs(directory: str) -> list[str]:
    return sorted(d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d)) and d[0] != ".")


def _image_folder(path: str) -> Source:
    subdirs = _class_dirs(path)
    split_names = ("train", "test", *VALIDATION_SPLITS)
    roots = {s: os.path.join(path, s) for s in subdirs} if subdirs and set(subdirs) <= set(split_names) else {}
    roots = roots or {"train": path}
    classes = sorted({c for root in roots.values() for c in _class_dirs(root)})
    if not classes:
        raise DataError(f"image folder {path} has no class subfolders (expected {path}/<class>/<image>)")
    splits = {}
    for name, root in roots.items():
        items = [(f, c) for c in _class_dirs(root) for f in _image_files(os.path.join(root, c))]
        if not items:
            raise DataError(f"image folder {root} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        splits[name] = Split([f for f, _ in items], [c for _, c in items])
    return Source(path, "image-folder", splits, class_names=classes)


def _read_table(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            if path.lower().endswith((".csv", ".tsv")):
                rows = list(csv.DictReader(f, delimiter="\t" if path.lower().endswith(".tsv") else ","))
            else:
                rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as err:
        raise DataError(f"cannot read {path}: {err}") from err
    if not rows:
        raise DataError(f"{path} holds no rows")
    if not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{path}: every JSON line must be an object with named columns")
    return rows


def _table(path: str) -> Source:
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.lower().endswith(TABLE_EXTENSIONS))
        if not files:
            raise DataError(f"{path} holds no {'/'.join(TABLE_EXTENSIONS)} files")
        names = [os.path.splitext(f)[0] for f in files]
        if len(set(names)) != len(names):
            raise DataError(f"{path} holds several files per split: {files}")
        tables = {n: _read_table(os.path.join(path, f)) for n, f in zip(names, files)}
        base = path
    else:
        tables = {"train": _read_table(path)}
        base = os.path.dirname(os.path.abspath(path))
    return Source(path, "table", {n: _RawSplit(rows) for n, rows in tables.items()}, base_dir=base)


@dataclass
class _RawSplit:
    """A split whose columns are not chosen yet: table ``rows`` or a Hugging Face dataset."""

    rows: list[dict[str, Any]] | Any

    @property
    def columns(self) -> list[str]:
        return list(self.rows[0]) if isinstance(self.rows, list) else list(self.rows.column_names)

    def column(self, name: str) -> Sequence[Any]:
        """The column, lazily for a Hugging Face dataset (images decode on access)."""
        return self.values(name) if isinstance(self.rows, list) else _Column(self.rows, name)

    def values(self, name: str) -> list[Any]:
        return [r.get(name) for r in self.rows] if isinstance(self.rows, list) else list(self.rows[name])

    def names(self, column: str) -> list[str] | None:
        """The class names of a Hugging Face ``ClassLabel`` column, else ``None``."""
        feature = None if isinstance(self.rows, list) else self.rows.features.get(column)
        names = getattr(feature, "names", None)
        return list(names) if names else None


def _hf_saved(path: str) -> Source:
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"{path} is a saved Hugging Face dataset; reading it needs the 'datasets' package: "
            "pip install 'sopfast[data]' (or pip install datasets)"
        ) from err
    try:
        loaded = datasets.load_from_disk(path)
    except (OSError, ValueError, FileNotFoundError) as err:
        raise DataError(f"cannot load the saved dataset {path}: {err}") from err
    parts = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    return Source(path, "hf-datasets", {n: _RawSplit(rows=d) for n, d in parts.items()}, base_dir=path)


def open_source(path: str) -> Source:
    """Open ``path`` as an image folder, a saved Hugging Face dataset or CSV/JSONL data (module docstring)."""
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist")
    if os.path.isfile(path):
        if not path.lower().endswith(TABLE_EXTENSIONS):
            raise DataError(
                f"{path} is a file but not {'/'.join(TABLE_EXTENSIONS)}; give a CSV/TSV/JSONL file, "
                "an image folder or a saved Hugging Face dataset directory"
            )
        return _table(path)
    entries = os.listdir(path)
    if "dataset_dict.json" in entries or "state.json" in entries:
        return _hf_saved(path)
    if any(e.lower().endswith(TABLE_EXTENSIONS) for e in entries):
        return _table(path)
    return _image_folder(path)


# -- columns and labels ------------------------------------------------------------------------------
@dataclass
class Columns:
    """Column names: ``image`` or ``text`` (+ ``text_pair``), and ``label``; ``None`` picks the default."""

    image: str | None = None
    text: str | None = None
    text_pair: str | None = None
    label: str | None = None
    object_mask: str | None = None


def _pick(
    kind: str, given: str | None, available: Sequence[str], defaults: Sequence[str], flag: str, where: str
) -> str:
    if given is not None:
        if given not in available:
            raise DataError(f"{where} has no {kind} column {given!r} ({flag}); columns: {list(available)}")
        return given
    found = next((c for c in defaults if c in available), None)
    if found is None:
        raise DataError(
            f"{where} has no {kind} column (looked for {list(defaults)}); columns: {list(available)}; "
            f"name it with {flag}"
        )
    return found


def _choose_columns(source: Source, modality: str, columns: Columns) -> dict[str, Split]:
    """Turn every raw split of a table / saved dataset into a :class:`Split` of the chosen columns."""
    out = {}
    for name, raw in source.splits.items():
        if not isinstance(raw, _RawSplit):
            out[name] = raw
            continue
        where = f"{source.path} (split {name!r})"
        have = raw.columns
        label = _pick("label", columns.label, have, LABEL_COLUMNS, "--label-column", where)
        if modality == "image":
            image = _pick("image", columns.image, have, IMAGE_COLUMNS, "--image-column", where)
            masks = None
            if columns.object_mask is not None:
                masks = raw.column(_pick("object-mask", columns.object_mask, have, (), "--object-masks", where))
            out[name] = Split(raw.column(image), raw.values(label), label_names=raw.names(label), masks=masks)
            continue
        text = _pick("text", columns.text, have, TEXT_COLUMNS, "--text-column", where)
        pair = columns.text_pair
        if pair is None and PAIR_COLUMNS.get(text) in have:
            pair = PAIR_COLUMNS[text]
        elif pair is not None and pair not in have:
            raise DataError(f"{where} has no text-pair column {pair!r} (--text-pair-column); columns: {have}")
        texts = raw.values(text)
        pairs = raw.values(pair) if pair is not None else None
        for column, values in ((text, texts), (pair, pairs or [])):
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                raise DataError(f"{where}: column {column!r} row {bad} is not a text: {values[bad]!r}")
        out[name] = Split(texts, raw.values(label), pairs, raw.names(label))
    return out


def _as_int(value: Any) -> int | None:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def label_ids(
    splits: Mapping[str, Split], prep: Preprocessing, class_names: Sequence[str] | None, where: str
) -> tuple[Callable[[Any], int], list[str]]:
    """The map raw label → class id for all ``splits`` at once (module docstring), and the class names."""
    raw = [v for s in splits.values() for v in s.labels]
    if any(v is None or (isinstance(v, str) and not v.strip()) for v in raw):
        raise DataError(f"{where}: some labels are empty")
    n = prep.num_classes
    id2name = {i: name for name, i in prep.label2id.items()}
    if not id2name:
        id2name = dict(enumerate(next((s.label_names for s in splits.values() if s.label_names), ())))
    ints = [i for i in (_as_int(v) for v in raw) if i is not None]
    if class_names is None and len(ints) == len(raw):
        bad = sorted({i for i in ints if n is not None and not 0 <= i < n})
        if bad and n is not None:
            raise DataError(f"{where}: class ids {bad[:5]} are outside the backbone's {n} classes (0..{n - 1})")
        names = [id2name.get(i, str(i)) for i in range(n or max(ints) + 1)]
        return _class_id, names
    names = sorted({str(v) for v in raw} | set(class_names or ()))
    if prep.label2id and set(names) <= set(prep.label2id):
        mapping = {name: prep.label2id[name] for name in names}
    else:
        mapping = {name: i for i, name in enumerate(names)}
    if n is not None and len(mapping) and max(mapping.values()) >= n:
        raise DataError(f"{where}: {len(mapping)} classes {names[:6]}… but the backbone has {n} classes")
    classes = [id2name.get(i, str(i)) for i in range(n or len(mapping))]
    for name, i in mapping.items():
        classes[i] = name
    return (lambda v: mapping[str(v)]), classes


def _class_id(value: Any) -> int:
    """An integer label (int, integral float or digit string) as its class id."""
    class_id = _as_int(value)
    if class_id is None:
        raise DataError(f"label {value!r} is not an integer class id")
    return class_id


# -- datasets --------------------------------------------------------------------------------------
def load_image(source: Any, base_dir: str = "") -> PILImage.Image:
    """A PIL image from a path (relative to ``base_dir``), a PIL image, encoded bytes or an array."""
    import io

    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        return source
    if isinstance(source, dict) and (source.get("bytes") or source.get("path")):
        source = io.BytesIO(source["bytes"]) if source.get("bytes") else source["path"]
    if isinstance(source, (str, os.PathLike, io.BytesIO)):
        path = os.path.join(base_dir, source) if isinstance(source, (str, os.PathLike)) else source
        try:
            image = Image.open(path)
            image.load()
            return image
        except (OSError, UnidentifiedImageError) as err:
            raise DataError(f"cannot read the image {path}: {err}") from err
    array = np.asarray(source)
    if array.dtype != np.uint8:
        array = np.clip(array * (255.0 if array.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3):
        raise DataError(f"an image array must be [H, W] or [H, W, C], got shape {array.shape}")
    return Image.fromarray(array)


def load_split(
    path: str,
    role: str,
    prep: Preprocessing,
    *,
    columns: Columns | None = None,
    split: str | None = None,
    holdout: float = 0.1,
    limit: int | None = None,
    object_masks: ObjectMasks | None = None,
) -> tuple[ImageDataset | TextDataset, str]:
    """The dataset for ``role`` (``"train"``, ``"val"``, ``"test"``) of the data at ``path``, preprocessed
    with ``prep``; ``split`` names the source's split, ``limit`` keeps the first examples; with
    ``object_masks`` image items are ``(x, y, mask)``.  Returns the dataset and a description of the
    split used."""
    if not 0 < holdout < 1:
        raise DataError(f"holdout must lie in (0, 1), got {holdout!r}")
    source = open_source(path)
    if source.kind == "image-folder" and prep.modality == "text":
        raise DataError(f"{path} is an image folder but the backbone is a text model")
    splits = _choose_columns(source, prep.modality, columns or Columns())
    label_of, classes = label_ids(splits, prep, source.class_names, path)
    source = replace(source, splits=splits)
    name, chosen = source.resolve(role, split, holdout)
    if limit is not None:
        chosen = chosen.take(range(min(limit, len(chosen.labels))))
    if prep.modality == "text":
        labels = [label_of(v) for v in chosen.labels]
        pairs = list(chosen.pairs) if chosen.pairs is not None else None
        texts = TextDataset.tokenize(
            prep.tokenizer, list(chosen.inputs), labels, pairs, prep.max_length, classes=classes
        )
        return texts, name
    base_dir = source.base_dir
    read = lambda item: load_image(item, base_dir)
    masks = None if object_masks is None else _mask_reader(chosen, read, prep, object_masks, path)
    return ImageDataset(chosen.inputs, chosen.labels, read, prep.image, label_of, classes, masks), name


def _mask_reader(
    chosen: Split, read: Callable[[Any], Any], prep: Preprocessing, spec: ObjectMasks, path: str
) -> Callable[[int], torch.Tensor]:
    """Example ``i``'s ``[H, W]`` object mask: its mask image (``spec.column``) or its own bright pixels."""
    if spec.column is None:
        return lambda i: prep.object_mask(read(chosen.inputs[i]), spec.threshold)
    if chosen.masks is None:
        raise DataError(f"{path}: no object-mask column {spec.column!r} (--object-masks)")
    masks = chosen.masks
    return lambda i: prep.object_mask(read(masks[i]), 0.5)


__all__ = [
    "Columns",
    "DataError",
    "ImageDataset",
    "Source",
    "Split",
    "TextDataset",
    "label_ids",
    "load_image",
    "load_split",
    "open_source",
]
