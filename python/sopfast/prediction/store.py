"""The output directory of a prediction run: Parquet shards, the manifest that ties them to one model,
one dataset and one set of options, and what a resumed run finds there.

Layout (``datasets.load_dataset("parquet", data_dir=OUT)`` reads the shards and nothing else)::

    OUT/README.md                               the dataset card (:mod:`sopfast.prediction.card`)
    OUT/data/train-00000-of-00010.parquet       shard 0: example ids 0 … shard_size − 1
    OUT/data/.train-00003-of-00010.parquet.tmp  a shard being written (renamed when complete)
    OUT/predict.json                            the manifest: fingerprints, sizes, columns
    OUT/skipped.tsv                             examples that could not be read (id, source, error)

A shard file exists only once complete (written to a hidden temporary file, then renamed), so a
run killed at any moment leaves complete shards and at most one temporary file per process.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from .loading import Skipped, read_example

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT = "sopfast-predict/1"
MANIFEST = "predict.json"
SKIPPED = "skipped.tsv"
DATA = "data"
SKIPPED_KEY = b"sopfast.skipped"
#: Examples hashed into the data fingerprint (first, quartiles, last).
PROBES = 5
#: Manifest entries that must match for a run to continue in a directory.
FINGERPRINT = ("format", "model", "data", "settings", "examples", "shard_size")


def model_fingerprint(model: torch.nn.Module, settings: Mapping[str, Any]) -> str:
    """A hash of every parameter and buffer of ``model`` (names, dtypes, shapes, values) and ``settings``."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps({"class": type(model).__name__, **settings}, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        _update(digest, name, tensor)
    return digest.hexdigest()


def data_fingerprint(dataset: Any, examples: int) -> str:
    """A hash of the dataset's length and of :data:`PROBES` examples spread over it (reading all
    of a large dataset to hash it would cost as much as predicting it)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{type(dataset).__name__}:{examples}".encode())
    for index in sorted({(examples - 1) * j // (PROBES - 1) for j in range(PROBES)}):
        item, error = read_example(dataset, index)
        _update(digest, str(index), item if error is None else error)
    return digest.hexdigest()


def _update(digest: Any, name: str, value: Any) -> None:
    digest.update(name.encode())
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            _update(digest, str(key), value[key])
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _update(digest, str(i), item)
    else:
        digest.update(repr(value).encode())


class OutputDir:
    """``path`` as the output of one run (module docstring): shard paths, the manifest, the skipped list."""

    def __init__(self, path: str | os.PathLike, shards: int):
        self.path = os.fspath(path)
        self.shards = shards

    def shard_path(self, shard: int) -> str:
        return os.path.join(self.path, DATA, f"train-{shard:05d}-of-{self.shards:05d}.parquet")

    def _temporary(self, shard: int) -> str:
        return os.path.join(self.path, DATA, f".train-{shard:05d}-of-{self.shards:05d}.parquet.tmp")

    def done(self, shard: int) -> bool:
        return os.path.exists(self.shard_path(shard))

    def check(self, manifest: dict[str, Any]) -> bool:
        """Whether the directory already holds this run (the same manifest: resume it); False when it
        is missing or empty.  ValueError when it holds another run or anything else."""
        path = os.path.join(self.path, MANIFEST)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                found = json.load(f)
            differs = [k for k in FINGERPRINT if found.get(k) != manifest[k]]
            if differs:
                raise ValueError(
                    f"output_dir {self.path} holds predictions of another run ({', '.join(differs)} differ); "
                    "give a new directory, or delete it to start again"
                )
            return True
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"output_dir {self.path} is a file; give a directory")
        if os.path.isdir(self.path) and [e for e in os.listdir(self.path) if not e.startswith(f".{MANIFEST}")]:
            raise ValueError(
                f"output_dir {self.path} is not empty and holds no {MANIFEST}: give a new or empty directory"
            )
        return False

    def create(self, manifest: dict[str, Any]) -> None:
        """Start the directory: the manifest, written first (a run killed before it finds an empty
        directory, one killed after it resumes)."""
        os.makedirs(self.path, exist_ok=True)
        _write_atomic(os.path.join(self.path, MANIFEST), json.dumps(manifest, indent=2) + "\n")

    def open(self) -> None:
        """Make the data folder (every process, every run: idempotent)."""
        os.makedirs(os.path.join(self.path, DATA), exist_ok=True)

    def write_shard(self, shard: int, table: pa.Table, skipped: list[Skipped]) -> None:
        """Write ``table`` as shard ``shard`` (the ``skipped`` examples in its metadata), complete or not at all."""
        import pyarrow.parquet as pq

        metadata = {**(table.schema.metadata or {}), SKIPPED_KEY: json.dumps([asdict(s) for s in skipped]).encode()}
        temporary = self._temporary(shard)
        # no dictionaries (floats and paths rarely repeat: 5× faster to write, smaller files); statistics
        # for the scalar columns readers filter on
        scalars = [f.name for f in table.schema if not (f.type.num_fields or f.type == "string")]
        pq.write_table(
            table.replace_schema_metadata(metadata), temporary, use_dictionary=False, write_statistics=scalars
        )
        os.replace(temporary, self.shard_path(shard))

    def skipped(self) -> list[Skipped]:
        """The examples every shard skipped, by id."""
        import pyarrow.parquet as pq

        found = []
        for shard in range(self.shards):
            metadata = pq.read_schema(self.shard_path(shard)).metadata or {}
            found += [Skipped(**s) for s in json.loads(metadata.get(SKIPPED_KEY, b"[]"))]
        return sorted(found, key=lambda s: s.id)

    def finish(self, card: str, skipped: Iterable[Skipped]) -> str | None:
        """Write the card and the skipped list (if any; its path is returned); remove leftover
        temporary files."""
        _write_atomic(os.path.join(self.path, "README.md"), card)
        for folder in (self.path, os.path.join(self.path, DATA)):
            for name in os.listdir(folder):
                if name.startswith(".") and name.endswith(".tmp"):
                    os.remove(os.path.join(folder, name))
        rows = [f"{s.id}\t{s.source or ''}\t{' '.join(s.error.split())}\n" for s in skipped]
        path = os.path.join(self.path, SKIPPED)
        if not rows:
            return None
        _write_atomic(path, "id\tsource\terror\n" + "".join(rows))
        return path


def _write_atomic(path: str, text: str) -> None:
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(temporary, path)
