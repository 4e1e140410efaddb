"""What identifies a training set, for a resume to tell the same data from other data.

:func:`data_identity` gives ``{"examples": N, "sha256": …, "basis": …}``, where ``basis`` says what the
hash covers:

* ``"file names and labels"`` – :class:`~sopfast.data.datasets.ImageDataset` (image folders, CSV/JSONL of
  paths; an image stored as bytes is hashed by its bytes);
* ``"token ids and labels"`` – :class:`~sopfast.data.datasets.TextDataset`;
* ``"tensors"`` – a ``TensorDataset`` whose tensors total at most :data:`FULL_HASH_BYTES` (every byte);
  ``"tensor shapes and N rows"`` above that (dtypes, shapes and :data:`SAMPLED_ROWS` evenly spaced rows);
* a ``Subset`` adds its indices to its dataset's basis;
* ``"count only"`` – any other dataset (its type named), unless it has an ``identity()`` method returning
  a string, which is hashed, or the caller gives a ``read`` function: then :data:`PROBES` examples spread
  over it (first, quartiles, last) are read and hashed (``"N examples read"``; ``sopfast.predict`` does,
  where reading them costs little beside predicting them all).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from ..integrity import state_sha256, update_with_tensor

#: A TensorDataset of at most this many bytes is hashed whole (about 0.2 s per 256 MiB).
FULL_HASH_BYTES = 256 * 2**20
#: Rows hashed of a larger TensorDataset.
SAMPLED_ROWS = 4096
#: Examples read (with ``read``) of a dataset of another kind.
PROBES = 5


def _source(digest: Any, source: Any) -> None:
    """An image's identity: its path, else its bytes or pixels."""
    if isinstance(source, dict):  # an undecoded datasets.Image
        source = source.get("path") or source.get("bytes")
    if isinstance(source, (str, os.PathLike)):
        digest.update(b"P" + os.fspath(source).encode() + b"|")
    elif isinstance(source, (bytes, bytearray)):
        digest.update(b"B" + hashlib.sha256(source).digest())
    else:
        array = np.asarray(source)
        digest.update(f"A{array.dtype}|{array.shape}|".encode() + np.ascontiguousarray(array).tobytes())


def _labels(digest: Any, labels: Sequence[Any] | torch.Tensor | None) -> None:
    if labels is None:  # data without labels (what sopfast.predict may read)
        digest.update(b"no labels|")
    elif isinstance(labels, torch.Tensor):
        update_with_tensor(digest, labels)
    else:
        digest.update(repr([str(v) for v in labels]).encode())


def _plain(value: Any) -> Any:
    """``value`` with every array-like (a NumPy array, a PIL image) a tensor, inside mappings and sequences,
    so that it hashes by its contents (a repr may hold a memory address)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    if not isinstance(value, (torch.Tensor, str, bytes)) and (
        hasattr(value, "__array__") or hasattr(value, "__array_interface__")
    ):
        return torch.from_numpy(np.array(value))  # a copy: contiguous and writable
    return value


def _probes(digest: Any, dataset: Any, read: Callable[[int], Any]) -> str:
    """Feed :data:`PROBES` examples spread over ``dataset``, each as ``read(index)`` returns it, into ``digest``."""
    n = len(dataset)
    picked = sorted({(n - 1) * j // (PROBES - 1) for j in range(PROBES)}) if n else []
    for index in picked:
        digest.update(f"{index}|{state_sha256(_plain(read(index)))}|".encode())
    return f"{len(picked)} examples read"


def _hash_into(digest: Any, dataset: Dataset) -> str:
    """Feed ``dataset``'s identity into ``digest``; returns the basis."""
    from .datasets import ImageDataset, TextDataset

    if isinstance(dataset, Subset):
        basis = _hash_into(digest, dataset.dataset)
        update_with_tensor(digest, torch.as_tensor(list(dataset.indices), dtype=torch.long))
        return f"{basis}, subset indices"
    if isinstance(dataset, ImageDataset):
        for source in dataset.sources:
            _source(digest, source)
        _labels(digest, dataset.labels)
        return "file names and labels"
    if isinstance(dataset, TextDataset):
        for name in sorted(dataset.encoded):
            update_with_tensor(digest, dataset.encoded[name])
        _labels(digest, dataset.labels)
        return "token ids and labels"
    if isinstance(dataset, TensorDataset):
        tensors = dataset.tensors
        if sum(t.numel() * t.element_size() for t in tensors) <= FULL_HASH_BYTES:
            for t in tensors:
                update_with_tensor(digest, t)
            return "tensors"
        n = len(tensors[0])
        rows = torch.linspace(0, n - 1, min(n, SAMPLED_ROWS)).round().long()
        for t in tensors:
            digest.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
            update_with_tensor(digest, t[rows])
        return f"tensor shapes and {len(rows)} rows"
    identity = getattr(dataset, "identity", None)
    if callable(identity):
        digest.update(str(identity()).encode())
        return f"{type(dataset).__name__}.identity()"
    digest.update(type(dataset).__qualname__.encode())
    return f"count only ({type(dataset).__name__} names no examples)"


def data_identity(data: Dataset | DataLoader, read: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """``{"examples", "sha256", "basis"}`` of a dataset (or a DataLoader's dataset): module docstring;
    ``read(index)``: an example of it, to identify a dataset of a kind not listed there by its examples."""
    dataset = data.dataset if isinstance(data, DataLoader) else data
    try:
        examples: int | None = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        examples = None
    digest = hashlib.sha256()
    basis = _hash_into(digest, dataset)
    if read is not None and basis.startswith("count only"):
        digest = hashlib.sha256(f"{type(dataset).__qualname__}|".encode())
        basis = _probes(digest, dataset, read)
    return {"examples": examples, "sha256": digest.hexdigest(), "basis": basis}


def describe_identity(identity: Any) -> str:
    """One line for a :func:`data_identity` record."""
    if not isinstance(identity, dict):
        return repr(identity)
    return f"{identity.get('examples')} examples, sha256 {str(identity.get('sha256'))[:12]}… of {identity.get('basis')}"
