"""Labels of your own data → the backbone's class ids, with no silent guess.

* ``label_map`` (``--label-map NAME=ID``) given: it maps the labels it names, each to a class id (an
  integer: ``true`` or ``1.5`` is refused) or to a class name of the backbone; the other labels map
  through the backbone's ``label2id`` (a partial map completes the backbone's names), and a label
  neither names is an error listing them.
* Integer labels (ints, integral floats, digit strings) are class ids.
* Names (strings, ``ClassLabel`` names) map through the backbone's ``label2id`` when the backbone names its
  classes; a name it does not name (another spelling, another case, an id among names) is an error
  listing them (every one, with the near matches among the backbone's names) — never a fallback to
  another order.  A backbone that names no classes (Hugging Face's ``LABEL_0`` …) takes names in sorted
  order (``ClassLabel`` columns: in their own order); there, labels that mix class ids and names
  (``cat``, ``dog``, ``2``) are an error: ``2`` could be class 2 or a third name.
"""

from __future__ import annotations

import difflib
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


def _map_target(target: Any, label2id: Mapping[str, int]) -> int | None:
    """A ``label_map`` value as a class id: a class name of the backbone, an integer or a digit string
    (a bool or a float is neither)."""
    if isinstance(target, str):
        return label2id[target] if target in label2id else as_int(target)
    if isinstance(target, (int, np.integer)) and not isinstance(target, (bool, np.bool_)):
        return int(target)
    return None


def _resolve_map(
    label_map: Mapping[Any, Any], label2id: Mapping[str, int], n: int | None, where: str
) -> dict[str, int]:
    """``label_map`` as ``{label: class id}``: values are ids or class names of the backbone."""
    out = {}
    for label, target in label_map.items():
        class_id = _map_target(target, label2id)
        if class_id is None:
            near = _near([str(target)], label2id)
            named = f"; the backbone's class names: {sorted(label2id)}{near}" if label2id else ""
            raise DataError(
                f"{where}: label_map {label!r} → {target!r} is neither a class id (an integer) nor a class name{named}"
            )
        if class_id < 0 or (n is not None and class_id >= n):
            raise DataError(
                f"{where}: label_map {label!r} → {class_id} is outside the backbone's {n} classes (0..{(n or 1) - 1})"
            )
        out[str(label)] = class_id
    return out


def _near(names: Sequence[str], label2id: Mapping[str, int]) -> str:
    """``"; did you mean: 'a' → 'A', …?"`` for the ``names`` close to a class name of the backbone
    (:func:`difflib.get_close_matches`, ignoring case), else ``""``."""
    known = {k.lower(): k for k in label2id}
    pairs = []
    for name in names:
        close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.6)
        if close:
            pairs.append(f"{name!r} → {known[close[0]]!r}")
    return f"; did you mean: {', '.join(pairs)}?" if pairs else ""


def _unnamed(names: Sequence[str], label2id: Mapping[str, int], where: str) -> DataError:
    return DataError(
        f"{where}: labels {list(names)} are not classes of the backbone, whose label2id names "
        f"{sorted(label2id)}{_near(names, label2id)}; fix the labels or map them with --label-map NAME=ID "
        "(label_map=; the labels it leaves out map through the backbone's names)"
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
        rest = sorted({str(v) for v in labels} - set(mapping))
        unmapped = [name for name in rest if name not in prep.label2id]
        if unmapped:
            named = f" nor the backbone's label2id ({sorted(prep.label2id)})" if prep.label2id else ""
            raise DataError(
                f"{where}: label_map does not map the labels {unmapped}{named}{_near(unmapped, prep.label2id)}"
            )
        return _by_name({**{name: prep.label2id[name] for name in rest}, **mapping}, id2name, n)
    if class_names is not None:  # a ClassLabel column over a backbone that names no classes: its order
        id2name = dict(enumerate(class_names))
    ints = [as_int(v) for v in labels]
    if all(i is not None for i in ints):
        found = [i for i in ints if i is not None]
        bad = sorted({i for i in found if i < 0 or (n is not None and i >= n)})
        if bad:
            raise DataError(f"{where}: class ids {bad} are outside the backbone's {n} classes (0..{(n or 1) - 1})")
        return _class_id, [id2name.get(i, str(i)) for i in range(n or max(found) + 1)]
    names = sorted({str(v) for v in labels})
    if not prep.label2id and class_names is None and any(i is not None for i in ints):
        numbers = sorted({str(v) for v, i in zip(labels, ints) if i is not None})
        words = sorted({str(v) for v, i in zip(labels, ints) if i is None})
        raise DataError(
            f"{where}: the labels mix class ids {numbers} and names {words}, and the backbone names no classes: "
            "give every label as a name or every one as a class id, or map them with --label-map NAME=ID"
        )
    if prep.label2id:
        unnamed = [name for name in names if name not in prep.label2id]
        if unnamed:
            raise _unnamed(unnamed, prep.label2id, where)
        mapping = {name: prep.label2id[name] for name in names}
    else:
        mapping = {name: i for i, name in enumerate(names)}
    if n is not None and max(mapping.values()) >= n:
        raise DataError(f"{where}: {len(mapping)} classes {names} but the backbone has {n} classes")
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
