"""Your own data for the command line (and for scripts), read with Hugging Face ``datasets``:
image folders, saved datasets, CSV / TSV / JSONL files; preprocessing read from the backbone.

Data sources (:func:`open_source`):

* **image folder** – ``root/<class>/<image>``, or one such folder per split,
  ``root/{train,validation,test}/<class>/<image>`` (``load_dataset("imagefolder")``);
* **saved Hugging Face dataset** – a directory written by ``Dataset.save_to_disk`` or
  ``DatasetDict.save_to_disk`` (``load_from_disk``);
* **CSV / TSV / JSONL** – one file, or a directory of ``<split>.csv`` / ``<split>.jsonl`` files
  (``load_dataset("csv" / "json")``); columns hold a text (and optionally a second text) or an image
  path (relative to the file), and a label.

Columns default to the usual names (:data:`IMAGE_COLUMNS`, :data:`TEXT_COLUMNS`,
:data:`LABEL_COLUMNS`); flags name others.  Splits: a source's own ``train`` / ``validation`` /
``test`` splits, chosen by name if wanted.  Validation never comes from the test split: without a
validation split it is held out of the training split (``holdout`` of it, stratified
``Dataset.train_test_split`` with a fixed seed, so that ``train`` and ``evaluate`` agree); a source with
one split is cut three ways (a held-out test part, then a validation part of the rest).  ``limit``
keeps examples of every class alike (:func:`sopfast.data.sampling.across_classes`).

Labels: :mod:`sopfast.data.labels` (integers are class ids; names map through ``label_map`` and the
backbone's ``label2id`` — a name neither knows is an error; sorted order only for a backbone that names
no classes, where ids mixed with names are refused).  Training data of one class is refused, and so is
an image folder with entries it would skip (:mod:`sopfast.data.folders`).

Preprocessing (:class:`sopfast.adapters.preprocessing.Preprocessing`) comes from the backbone: see
:func:`sopfast.adapters.preprocessing.preprocessing_for`.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ..adapters.preprocessing import Preprocessing
from ..defaults import HOLDOUT
from .datasets import ImageDataset, TextDataset
from .folders import check_image_folder
from .labels import DataError, check_classes, label_ids
from .object_masks import ObjectMasks
from .sampling import across_classes

if TYPE_CHECKING:
    from PIL import Image as PILImage

TABLE_BUILDERS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json"}
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


@contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """``datasets`` without its progress bars and info logs (a tiny folder loads in a blink)."""
    try:
        import datasets
    except ImportError as err:
        raise DataError("reading your own data needs the 'datasets' package: pip install 'sopfast[data]'") from err
    bars = not datasets.utils.are_progress_bars_disabled()
    level = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield datasets
    finally:
        datasets.logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()


@dataclass
class Source:
    """A data source: its named ``splits`` (Hugging Face ``Dataset`` s) and the directory that
    relative image paths start from."""

    path: str
    kind: str
    splits: Mapping[str, Any]
    base_dir: str = ""

    def resolve(
        self, role: str, name: str | None = None, holdout: float | None = HOLDOUT, label: str = "label"
    ) -> tuple[str, Any]:
        """The split for ``role`` (``"train"``, ``"val"``, ``"test"``) and a line naming it: ``name`` if
        given, else the source's own split, else the held-out part of a single split (stratified by the
        ``label`` column), or with ``holdout=None`` that single split whole."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        available = list(self.splits)
        if name is not None:
            if name not in self.splits:
                raise DataError(f"{self.path} has no split {name!r}; available: {available}")
            return name, self.splits[name]
        validation = next((s for s in VALIDATION_SPLITS if s in self.splits), None)
        test = "test" if "test" in self.splits else None
        if role == "val" and validation is not None:
            return validation, self.splits[validation]
        if role == "test" and (test or validation) is not None:
            if test is None:
                logger.warning(
                    "%s has no test split: evaluating on the validation split %r, which chose the best model; "
                    "its score is optimistic",
                    self.path,
                    validation,
                )
            return cast(str, test or validation), self.splits[cast(str, test or validation)]
        train = "train" if "train" in self.splits else (available[0] if len(available) == 1 else None)
        if train is None:
            flag = {"train": "--train-split", "val": "--val-split"}.get(role, "--split")
            raise DataError(
                f"{self.path} has no {role!r} split and no single split to cut one from; "
                f"available: {available}; name one with {flag}"
            )
        if (role == "train" and validation is not None) or holdout is None:
            return train, self.splits[train]
        pool, total, left = self.splits[train], len(self.splits[train]), ""
        if test is None and validation is None:  # one split: a test part first, never used for validation
            pool, held, how = _holdout(train, pool, "test", holdout, label, warn=role == "test")
            if role == "test":
                return f"{train}, held-out test part ({len(held)} of {total}, {how})", held
            left = f" of the {len(pool)} left after the test part"
        rest, held, how = _holdout(train, pool, "val", holdout, label, warn=role == "val")
        if role == "val":
            return f"{train}, validation part held out of it ({len(held)}{left or f' of {len(pool)}'}, {how})", held
        cut = "the test and validation parts" if left else "the validation part"
        return f"{train}, training part ({len(rest)} of {total}: {cut} held out, {how})", rest


def _holdout(name: str, split: Any, role: str, fraction: float, label: str, warn: bool = False) -> tuple[Any, Any, str]:
    """``split`` cut in two: the remaining part, the held-out part (a ``fraction`` of each class, stratified
    where every class has two examples or more) and how it was cut, with a fixed seed so every command
    cuts alike; with ``warn``, a held-out part with few examples of a class is logged (``role``, ``"test"``
    or ``"val"``, names the part)."""
    import datasets

    n = len(split)
    if n < 2:
        part = "test" if role == "test" else "validation"
        raise DataError(f"split {name!r} has {n} example(s) left: too few to hold out a {part} part")
    counts = Counter(str(v) for v in split[label])
    k = len(counts)
    held = min(n - 1, max(1, round(n * fraction)))
    stratify = min(counts.values()) >= 2 and n >= 2 * k
    if stratify:
        held = min(max(held, k), n - k)  # at least one example of every class on each side
        names = sorted(counts)
        split = split.map(lambda row: {"__class__": names.index(str(row[label]))})
        split = split.cast_column("__class__", datasets.ClassLabel(names=names))
    parts = split.train_test_split(
        test_size=held, seed=HOLDOUT_SEED, stratify_by_column="__class__" if stratify else None
    )
    rest, part = (p.remove_columns("__class__") if stratify else p for p in (parts["train"], parts["test"]))
    if warn:
        held_counts = Counter(str(v) for v in part[label])
        few = sorted(c for c in counts if held_counts[c] < MIN_HELD_OUT_PER_CLASS)
        if few:
            names = _class_names(split, label) or []  # ClassLabel values are indices: name them
            few = [names[int(c)] if c.isdigit() and int(c) < len(names) else c for c in few]
            logger.warning(
                "the %s part held out of %r has %d examples, fewer than %d for classes %s: its scores are noisy "
                "(use more data, a larger --holdout or a split of its own)",
                "test" if role == "test" else "validation",
                name,
                held,
                MIN_HELD_OUT_PER_CLASS,
                few[:5],
            )
    how = "stratified" if stratify else "not stratified: too few examples per class"
    return rest, part, f"{how}, seed {HOLDOUT_SEED}"


def _load(datasets: Any, path: str, builder: str, data_files: dict[str, str], **options: Any) -> Any:
    try:
        return datasets.load_dataset(builder, data_files=data_files, **options)
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as err:
        cause = err.__cause__ or err
        raise DataError(f"cannot read {path}: {cause}") from err


def _table(datasets: Any, path: str) -> Source:
    """One table file (its only split, ``train``) or a directory of ``<split>.<ext>`` files."""
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if os.path.splitext(f)[1].lower() in TABLE_BUILDERS)
        names = [os.path.splitext(f)[0] for f in files]
        if len(set(names)) != len(names) or len({os.path.splitext(f)[1].lower() for f in files}) > 1:
            raise DataError(f"{path} holds several files per split or several formats: {files}")
        data_files, base = {n: os.path.join(path, f) for n, f in zip(names, files)}, path
    else:
        data_files, base = {"train": path}, os.path.dirname(os.path.abspath(path))
    extension = os.path.splitext(next(iter(data_files.values())))[1].lower()
    options = {"delimiter": "\t"} if extension == ".tsv" else {}
    loaded = _load(datasets, path, TABLE_BUILDERS[extension], data_files, **options)
    empty = [n for n, d in loaded.items() if len(d) == 0]
    if empty:
        raise DataError(f"{path}: split {empty[0]!r} holds no rows")
    return Source(path, "table", dict(loaded), base_dir=base)


def _plain_splits(datasets: Any, path: str) -> dict[str, list[str]] | None:
    """The data files ``datasets`` infers for an image folder whose layout is plain — one split, or
    only split-named folders at the top — found in one walk of the tree; ``None`` (let ``datasets``
    infer) where any other name holds a split keyword.  ``datasets`` tries ~70 patterns, each a walk
    of the whole tree."""
    keywords = {k: str(split) for split, words in datasets.data_files.SPLIT_KEYWORDS.items() for k in words}
    special = ("task.toml", "instruction.md", "data")  # names of datasets' other layouts

    def shown(name: str) -> bool:  # datasets skips hidden files and "__" folders
        return not name.startswith((".", "__"))

    top = [e for e in os.listdir(path) if shown(e)]
    splits = [e for e in top if e in keywords and os.path.isdir(os.path.join(path, e))]
    if splits and (len(splits) != len(top) or len({keywords[n] for n in splits}) != len(splits)):
        return None
    for folder, subfolders, files in os.walk(path):
        subfolders[:] = [d for d in subfolders if shown(d)]
        names = [d for d in subfolders if folder != path or d not in splits] + [f for f in files if shown(f)]
        if any(n.lower() in special or any(k in n.lower() for k in keywords) for n in names):
            return None
    if not splits:
        return {"train": ["**"]}
    order = [str(split) for split in datasets.data_files.SPLIT_KEYWORDS]  # datasets' order: train, validation, test
    return {keywords[name]: [f"{name}/**"] for name in sorted(splits, key=lambda n: order.index(keywords[n]))}


def _image_folder(datasets: Any, path: str) -> Source:
    check_image_folder(path)
    try:
        loaded = datasets.load_dataset("imagefolder", data_dir=path, data_files=_plain_splits(datasets, path))
    except (datasets.data_files.EmptyDatasetError, FileNotFoundError) as err:
        raise DataError(f"image folder {path} holds no images: {err}") from err
    if any("label" not in d.column_names for d in loaded.values()):
        folders = [e for e in os.listdir(path) if os.path.isdir(os.path.join(path, e)) and not e.startswith(".")]
        if len(folders) == 1:
            raise DataError(f"image folder {path} holds one class ({folders[0]!r}); SOP needs two or more")
        raise DataError(f"image folder {path} has no class subfolders (expected {path}/<class>/<image>)")
    splits = {n: d.cast_column("image", datasets.Image(decode=False)) for n, d in loaded.items()}
    return Source(path, "image-folder", splits, base_dir=path)


def open_source(path: str) -> Source:
    """Open ``path`` as an image folder, a saved Hugging Face dataset or CSV/JSONL data (module docstring)."""
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist")
    with _quiet_datasets() as datasets:
        if os.path.isfile(path):
            if os.path.splitext(path)[1].lower() not in TABLE_BUILDERS:
                raise DataError(
                    f"{path} is a file but not {'/'.join(TABLE_BUILDERS)}; give a CSV/TSV/JSONL file, "
                    "an image folder or a saved Hugging Face dataset directory"
                )
            return _table(datasets, path)
        entries = os.listdir(path)
        if "dataset_dict.json" in entries or "state.json" in entries:
            try:
                loaded = datasets.load_from_disk(path)
            except (OSError, ValueError) as err:
                raise DataError(f"cannot load the saved dataset {path}: {err}") from err
            parts = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
            return Source(path, "hf-datasets", parts, base_dir=path)
        if any(os.path.splitext(e)[1].lower() in TABLE_BUILDERS for e in entries):
            return _table(datasets, path)
        return _image_folder(datasets, path)


# -- columns and labels ------------------------------------------------------------------------------
@dataclass
class Columns:
    """Column names: ``image`` or ``text`` (+ ``text_pair``), ``label`` and ``object_mask``; ``None``
    picks the default."""

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


@dataclass
class _Chosen:
    """The columns chosen in every split of a source: ``inputs`` (image or text), ``pair``, ``label``
    (``None``: the data has none), ``mask``."""

    inputs: str
    label: str | None
    pair: str | None = None
    mask: str | None = None


def _choose_columns(source: Source, modality: str, columns: Columns, labels_optional: bool = False) -> _Chosen:
    """The columns to read, the same in every split (checked in each); texts checked to be texts.  With
    ``labels_optional`` data without a label column (none named, none of :data:`LABEL_COLUMNS`) has none."""
    chosen = None
    for name, split in source.splits.items():
        where, have = f"{source.path} (split {name!r})", split.column_names
        unlabelled = labels_optional and columns.label is None and not set(LABEL_COLUMNS) & set(have)
        label = None if unlabelled else _pick("label", columns.label, have, LABEL_COLUMNS, "--label-column", where)
        if modality == "image":
            image = _pick("image", columns.image, have, IMAGE_COLUMNS, "--image-column", where)
            if image == label:
                raise DataError(f"{where}: the image column {image!r} is the label column (--image-column)")
            mask = None
            if columns.object_mask is not None:
                mask = _pick("object-mask", columns.object_mask, have, (), "--object-masks", where)
            here = _Chosen(image, label, mask=mask)
        else:
            text = _pick("text", columns.text, have, TEXT_COLUMNS, "--text-column", where)
            if text == label:
                raise DataError(f"{where}: the text column {text!r} is the label column (--text-column)")
            pair = columns.text_pair
            if pair is None and PAIR_COLUMNS.get(text) in have:
                pair = PAIR_COLUMNS[text]
            elif pair is not None and pair not in have:
                raise DataError(f"{where} has no text-pair column {pair!r} (--text-pair-column); columns: {have}")
            if pair is not None and pair in (label, text):
                raise DataError(
                    f"{where}: the text-pair column (--text-pair-column) {pair!r} is the "
                    f"{'label' if pair == label else 'text'} column; name a second text column"
                )
            for column in filter(None, (text, pair)):
                values = split[column]
                bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
                if bad is not None:
                    raise DataError(f"{where}: column {column!r} row {bad} is not a text: {values[bad]!r}")
            here = _Chosen(text, label, pair=pair)
        chosen = chosen or here
    if chosen is None:
        raise DataError(f"{source.path} holds no splits")
    return chosen


def _class_names(split: Any, column: str) -> list[str] | None:
    """The names of a ``ClassLabel`` column, else ``None``."""
    names = getattr(split.features.get(column), "names", None)
    return list(names) if names else None


# -- datasets --------------------------------------------------------------------------------------
def load_image(source: Any, base_dir: str = "") -> PILImage.Image:
    """A PIL image from a path (relative to ``base_dir``), a PIL image, encoded bytes or an array."""
    import io

    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        return source
    if isinstance(source, dict):  # an undecoded datasets.Image: bytes or a path
        source = io.BytesIO(source["bytes"]) if source.get("bytes") else source.get("path")
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
    holdout: float | None = HOLDOUT,
    limit: int | None = None,
    object_masks: ObjectMasks | None = None,
    label_map: Mapping[Any, Any] | None = None,
    labels_optional: bool = False,
) -> tuple[ImageDataset | TextDataset, str]:
    """The dataset for ``role`` (``"train"``, ``"val"``, ``"test"``) of the data at ``path``, preprocessed
    with ``prep``; ``split`` names the source's split, ``limit`` keeps the first examples; with
    ``object_masks`` image items are ``(x, y, mask)``; ``label_map`` maps labels to class ids or class
    names of the backbone, the others mapping through its ``label2id`` (:mod:`sopfast.data.labels`);
    ``holdout=None`` holds nothing out; with ``labels_optional`` data without a label column gives unlabelled
    examples (``sopfast predict``: its labels are null).  Returns the dataset and a description of the split
    used; training data must hold two classes or more."""
    if holdout is not None and not 0 < holdout < 1:
        raise DataError(f"holdout must lie in (0, 1), got {holdout!r}")
    source = open_source(path)
    if source.kind == "image-folder" and prep.modality == "text":
        raise DataError(f"{path} is an image folder but the backbone is a text model")
    columns = columns or Columns()
    if object_masks is not None and object_masks.column is not None:
        columns = Columns(**{**vars(columns), "object_mask": object_masks.column})
    chosen = _choose_columns(source, prep.modality, columns, labels_optional)
    label_of: Callable[[Any], int] | None = None
    classes: list[str] = []
    if chosen.label is not None:
        first = next(iter(source.splits.values()))
        all_labels = [v for s in source.splits.values() for v in s[chosen.label]]
        label_of, classes = label_ids(all_labels, prep, _class_names(first, chosen.label), path, label_map)
    elif holdout is not None or label_map is not None:
        flag = "--holdout (a part held out per class)" if holdout is not None else "--label-map"
        raise DataError(f"{path} has no label column, which {flag} needs")
    logger.debug(
        "%s: %s source, splits %s; columns %s; classes %s",
        path,
        source.kind,
        list(source.splits),
        vars(chosen),
        classes,
    )
    with _quiet_datasets():  # unlabelled data: holdout is None, no label column is read
        name, data = source.resolve(role, split, holdout, chosen.label or LABEL_COLUMNS[0])
    if limit is not None and limit < len(data):
        by_class = chosen.label is not None
        data = data.select(
            across_classes([str(v) for v in data[chosen.label]], limit, HOLDOUT_SEED) if by_class else range(limit)
        )
    labels = None if chosen.label is None else data[chosen.label]
    ids = None if label_of is None or labels is None else [label_of(v) for v in labels]
    if role == "train" and ids is not None:
        check_classes(ids, classes, f"{path} (split {name})")
    if prep.modality == "text":
        pairs = data[chosen.pair] if chosen.pair is not None else None
        return TextDataset.tokenize(
            prep.tokenizer, data[chosen.inputs], ids, pairs, prep.max_length, classes=classes
        ), name
    read = lambda item: load_image(item, source.base_dir)
    images = data[chosen.inputs]  # a lazy column (datasets >= 4)
    masks = data[chosen.mask] if chosen.mask else images
    reader = None if object_masks is None else _mask_reader(images, masks, read, prep, object_masks)
    return ImageDataset(images, labels, read, prep.image, label_of, classes, reader, prep.images), name


def _mask_reader(
    images: Sequence[Any], masks: Sequence[Any], read: Callable[[Any], Any], prep: Preprocessing, spec: ObjectMasks
) -> Callable[[int], torch.Tensor]:
    """Example ``i``'s ``[H, W]`` object mask: its mask image (``spec.column``) or its own bright pixels."""
    if spec.column is None:
        return lambda i: prep.object_mask(read(images[i]), spec.threshold)
    return lambda i: prep.object_mask(read(masks[i]), 0.5)


__all__ = [
    "Columns",
    "DataError",
    "ImageDataset",
    "Source",
    "TextDataset",
    "label_ids",
    "load_image",
    "load_split",
    "open_source",
]
