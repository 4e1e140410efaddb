"""Labels of your own data → the backbone's class ids, with no silent guess.

* ``label_map`` (``--label-map NAME=ID``) given: it maps every label (to a class id, or to a class name of
  the backbone); a label it does not name is an error listing them.
* Integer labels (ints, integral floats, digit strings) are class ids.
* Names (strings, ``ClassLabel`` names) map through the backbone's ``label2id`` when the backbone names its
  classes; a name it does not name (another spelling, another case, an id among names) is an error
  listing them — never a fallback to another order.  A backbone that names no classes (Hugging Face's
  ``LABEL_0`` …) takes names in sorted order (``ClassLabel`` columns: in their own order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..adapters.preprocessing import Preprocessing


class DataError(ValueError):
    """Data that cannot be read as asked: the message names the path, column or split."""


def as_int(value: Any) -> int | None:
    """``value`` as an integer class id (an int, an integral float or a digit string), else ``None``."""
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _resolve_map(
    label_map: Mapping[Any, Any], label2id: Mapping[str, int], n: int | None, where: str
) -> dict[str, int]:
    """``label_map`` as ``{label: class id}``: values are ids or class names of the backbone."""
    out = {}
    for label, target in label_map.items():
        class_id = as_int(target) if not isinstance(target, str) or target not in label2id else label2id[target]
        if class_id is None:
            named = f"; the backbone's class names: {sorted(label2id)}" if label2id else ""
            raise DataError(f"{where}: label_map {label!r} → {target!r} is neither a class id nor a class name{named}")
        if class_id < 0 or (n is not None and class_id >= n):
            raise DataError(f"{where}: label_map {label!r} → {class_id} is outside the backbone's {n} classes")
        out[str(label)] = class_id
    return out


def _unnamed(names: Sequence[str], label2id: Mapping[str, int], where: str) -> DataError:
    known = {k.lower(): k for k in label2id}
    hints = [f"{name!r} (the backbone has {known[name.lower()]!r})" for name in names if name.lower() in known]
    hint = f"; differently spelt: {', '.join(hints[:3])}" if hints else ""
    return DataError(
        f"{where}: labels {list(names)[:8]} are not classes of the backbone, whose label2id names "
        f"{sorted(label2id)[:8]}{hint}; fix the labels or map them with --label-map NAME=ID (label_map=)"
    )


def label_ids(
    labels: Sequence[Any],
    prep: Preprocessing,
    class_names: Sequence[str] | None,
    where: str,
    label_map: Mapping[Any, Any] | None = None,
) -> tuple[Callable[[Any], int], list[str]]:
    """The map raw label → class id for all ``labels`` of a source at once (module docstring), and the
    class names.  ``class_names``: those of a ``ClassLabel`` column, whose labels are indices into them."""
    if any(v is None or (isinstance(v, str) and not v.strip()) for v in labels):
        raise DataError(f"{where}: some labels are empty")
    n = prep.num_classes
    id2name = {i: name for name, i in prep.label2id.items()}
    if class_names is not None and (prep.label2id or label_map is not None):  # indices of names: map the names
        names = list(class_names)
        to_id, classes = label_ids([names[int(v)] for v in set(labels)], prep, None, where, label_map)
        return (lambda v: to_id(names[int(v)])), classes
    if label_map is not None:
        mapping = _resolve_map(label_map, prep.label2id, n, where)
        unmapped = sorted({str(v) for v in labels} - set(mapping))
        if unmapped:
            raise DataError(f"{where}: label_map does not map the labels {unmapped[:8]}")
        return _by_name(mapping, id2name, n)
    if class_names is not None:  # a ClassLabel column over a backbone that names no classes: its order
        id2name = dict(enumerate(class_names))
    ints = [as_int(v) for v in labels]
    if all(i is not None for i in ints):
        found = [i for i in ints if i is not None]
        bad = sorted({i for i in found if i < 0 or (n is not None and i >= n)})
        if bad:
            raise DataError(f"{where}: class ids {bad[:5]} are outside the backbone's {n} classes (0..{(n or 1) - 1})")
        return _class_id, [id2name.get(i, str(i)) for i in range(n or max(found) + 1)]
    names = sorted({str(v) for v in labels})
    if prep.label2id:
        unnamed = [name for name in names if name not in prep.label2id]
        if unnamed:
            raise _unnamed(unnamed, prep.label2id, where)
        mapping = {name: prep.label2id[name] for name in names}
    else:
        mapping = {name: i for i, name in enumerate(names)}
    if n is not None and max(mapping.values()) >= n:
        raise DataError(f"{where}: {len(mapping)} classes {names[:6]}… but the backbone has {n} classes")
    return _by_name(mapping, id2name, n)


def _by_name(mapping: dict[str, int], id2name: dict[int, str], n: int | None) -> tuple[Callable[[Any], int], list[str]]:
    classes = [id2name.get(i, str(i)) for i in range(n or max(mapping.values()) + 1)]
    if not id2name:
        for name, i in mapping.items():
            classes[i] = name
    return (lambda v: mapping[str(v)]), classes


def _class_id(value: Any) -> int:
    """An integer label (int, integral float or digit string) as its class id."""
    class_id = as_int(value)
    if class_id is None:
        raise DataError(f"label {value!r} is not an integer class id")
    return class_id


def check_classes(ids: Sequence[int], classes: Sequence[str], where: str) -> None:
    """Training data must hold two classes or more (one class teaches nothing to tell apart)."""
    found = sorted(set(ids))
    if len(found) < 2:
        name = classes[found[0]] if found and found[0] < len(classes) else found
        raise DataError(
            f"{where}: the training data holds one class ({name!r}); SOP learns to tell classes apart, give "
            "examples of two or more"
        )
