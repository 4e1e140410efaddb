"""The output directory of a prediction run: Parquet shards, the manifest that ties them to one model,
one dataset and one set of options, the record each shard proves itself with, and what a resumed run
keeps.

Layout (``datasets.load_dataset("parquet", data_dir=OUT)`` reads the shards and nothing else)::

    OUT/README.md                               the dataset card (:mod:`sopfast.prediction.card`)
    OUT/data/train-00000-of-00010.parquet       shard 0: example ids 0 … shard_size − 1
    OUT/predict.json                            the manifest: fingerprints, sizes, columns, shard records
    OUT/skipped.tsv                             examples that could not be read (id, source, error)
    OUT/.records/train-00003-of-00010.json      a shard's record while the run goes on

Every file is written all-or-nothing (:func:`sopfast.model.state_files.atomic_write`: a hidden
temporary file, fsync, rename), so a run killed at any moment leaves complete files.  Once a shard is
in place, the process that wrote it writes its *record* — the SHA-256 of the file's bytes and the
example ids of its rows — under ``.records/`` (one file per shard: processes under ``torchrun`` never
write the same file); the first process gathers the records into ``predict.json`` at the end, after
checking that the rows hold every readable example's id exactly once.  A resumed run keeps a shard
only when it proves itself (:meth:`OutputDir.verify`): its record exists, its bytes have the recorded
SHA-256, its ids are the recorded ones, and with the examples it skipped they are the shard's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..integrity import listed, sha256_bytes
from ..model.state_files import atomic_write, remove_stale_temp_files
from .loading import ShardPlan, Skipped, read_example

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT = "sopfast-predict/1"
MANIFEST = "predict.json"
SKIPPED = "skipped.tsv"
DATA = "data"
RECORDS = ".records"
SKIPPED_KEY = b"sopfast.skipped"
#: Examples hashed into the data fingerprint (first, quartiles, last).
PROBES = 5
#: Manifest entries that must match for a run to continue in a directory.
FINGERPRINT = ("format", "model", "data", "settings", "examples", "shard_size")

logger = logging.getLogger(__name__)


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


def spans(ids: Sequence[int]) -> list[list[int]]:
    """Ascending ``ids`` as half-open ``[start, stop)`` runs: ``[0, 1, 2, 5]`` → ``[[0, 3], [5, 6]]``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _well_formed(record: Any) -> bool:
    """Whether ``record`` is ``{"sha256": hex, "ids": [[start, stop], …]}``."""
    runs = record.get("ids") if isinstance(record, dict) else None
    return (
        isinstance(runs, list)
        and isinstance(record.get("sha256"), str)
        and all(isinstance(run, list) and len(run) == 2 and all(type(i) is int for i in run) for run in runs)
    )


def _contents(source: str | bytes) -> tuple[list[int], list[Skipped]]:
    """The ``id`` column of a shard (a path or its bytes) and the examples it skipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = pq.ParquetFile(pa.BufferReader(source) if isinstance(source, bytes) else source)
    metadata = file.schema_arrow.metadata or {}
    skipped = [Skipped(**s) for s in json.loads(metadata.get(SKIPPED_KEY, b"[]"))]
    return file.read(columns=["id"]).column("id").to_pylist(), skipped


class OutputDir:
    """``path`` as the output of one run of ``plan`` (module docstring): shard paths, the manifest,
    the shard records, the skipped list."""

    def __init__(self, path: str | os.PathLike, plan: ShardPlan):
        self.path = os.fspath(path)
        self.plan = plan
        self.manifest_path = os.path.join(self.path, MANIFEST)

    def shard_name(self, shard: int) -> str:
        return f"train-{shard:05d}-of-{self.plan.shards:05d}.parquet"

    def shard_path(self, shard: int) -> str:
        return os.path.join(self.path, DATA, self.shard_name(shard))

    def _record_path(self, shard: int) -> str:
        return os.path.join(self.path, RECORDS, self.shard_name(shard).removesuffix(".parquet") + ".json")

    def check(self, manifest: dict[str, Any]) -> bool:
        """Whether the directory already holds this run (the same manifest: resume it); False when it
        is missing or empty.  ValueError when it holds another run, a manifest that cannot be read,
        files this run does not write in ``data/``, or anything without a manifest."""
        if os.path.exists(self.manifest_path):
            found = self._manifest()
            differs = [k for k in FINGERPRINT if found.get(k) != manifest[k]]
            if differs:
                raise ValueError(
                    f"output_dir {self.path} holds predictions of another run ({', '.join(differs)} differ); "
                    "give a new directory, or delete it to start again"
                )
            self._check_data_folder()
            return True
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"output_dir {self.path} is a file; give a directory")
        if os.path.isdir(self.path) and [e for e in os.listdir(self.path) if not e.startswith(f".{MANIFEST}")]:
            raise ValueError(
                f"output_dir {self.path} is not empty and holds no {MANIFEST}: give a new or empty directory"
            )
        return False

    def _manifest(self) -> dict[str, Any]:
        """``predict.json`` as written; ValueError naming it when it cannot be read (without it no shard
        can prove itself, and nothing says which run the directory holds)."""
        try:
            with open(self.manifest_path, encoding="utf-8") as f:
                found = json.load(f)
        except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
            problem = f"{type(err).__name__}: {err}"
        else:
            if isinstance(found, dict):
                return found
            problem = f"a JSON {type(found).__name__}, not an object"
        raise ValueError(
            f"{self.manifest_path} cannot be read ({problem}): no shard of {self.path} can be proven without it; "
            "delete the directory to start again, or give a new one"
        )

    def _check_data_folder(self) -> None:
        """Refuse files in ``data/`` that this run does not write: readers of it would take them for rows."""
        folder = os.path.join(self.path, DATA)
        if not os.path.isdir(folder):
            return
        ours = {self.shard_name(s) for s in range(self.plan.shards)}
        foreign = sorted(n for n in os.listdir(folder) if n not in ours and not n.startswith("."))
        if foreign:
            raise ValueError(
                f"{folder} holds files this run does not write ({listed(foreign)}); readers of the folder would "
                "take them for rows: move them out"
            )

    def create(self, manifest: dict[str, Any]) -> None:
        """Start the directory: the manifest, written first (a run killed before it finds an empty
        directory, one killed after it resumes)."""
        atomic_write(self.manifest_path, lambda f: f.write((json.dumps(manifest, indent=2) + "\n").encode()))

    def open(self) -> None:
        """Make the data and records folders (every process, every run: idempotent)."""
        for folder in (DATA, RECORDS):
            os.makedirs(os.path.join(self.path, folder), exist_ok=True)

    def records(self) -> dict[str, Any]:
        """Each shard's record by file name: ``predict.json``'s, replaced by a newer one in ``.records/``
        (an unreadable record file proves nothing and is passed over)."""
        found = self._manifest().get("records")
        records = dict(found) if isinstance(found, dict) else {}
        for shard in range(self.plan.shards):
            try:
                with open(self._record_path(shard), encoding="utf-8") as f:
                    records[self.shard_name(shard)] = json.load(f)
            except (OSError, ValueError):
                continue
        return records

    def verify(self, shard: int, records: Mapping[str, Any]) -> str | None:
        """``None`` when shard ``shard``'s file proves itself against its record, else why not."""
        record = records.get(self.shard_name(shard))
        if record is None:
            return f"it has no record in {MANIFEST} (a run stopped after writing it, or another program did)"
        if not _well_formed(record):
            return f"its record in {MANIFEST} is malformed"
        try:
            data = Path(self.shard_path(shard)).read_bytes()
        except OSError as err:
            return f"it cannot be read ({err})"
        if sha256_bytes(data) != record["sha256"]:
            return "its SHA-256 differs from the recorded one (the file was changed or damaged)"
        try:
            found, skipped = _contents(data)
        except Exception as err:  # any damage pyarrow or the metadata's JSON reports
            return f"it cannot be read as Parquet ({type(err).__name__}: {err})"
        if spans(found) != record["ids"]:
            return "its example ids differ from the recorded ones"
        if sorted(found + [s.id for s in skipped]) != list(self.plan.ids(shard)):
            return f"its rows and skipped examples are not shard {shard}'s ids {self.plan.ids(shard)}"
        return None

    def proven(self, shards: Iterable[int]) -> list[int]:
        """The ``shards`` whose files prove themselves (:meth:`verify`); one warning per other shard
        that has a file or a record, naming the file and why it is computed again."""
        records = self.records()
        kept = []
        for shard in shards:
            path = self.shard_path(shard)
            if not os.path.exists(path):
                if self.shard_name(shard) in records:
                    logger.warning("%s is recorded but missing: computing it again", path)
                continue
            reason = self.verify(shard, records)
            if reason is None:
                kept.append(shard)
            else:
                logger.warning("%s: %s; computing it again", path, reason)
        return kept

    def write_shard(self, shard: int, table: pa.Table, skipped: list[Skipped]) -> None:
        """Write ``table`` as shard ``shard`` (the ``skipped`` examples in its metadata), complete or not
        at all, then its record (the SHA-256 of the bytes written, the ids of the rows)."""
        import pyarrow.parquet as pq

        metadata = {**(table.schema.metadata or {}), SKIPPED_KEY: json.dumps([asdict(s) for s in skipped]).encode()}
        # no dictionaries (floats and paths rarely repeat: 5× faster to write, smaller files); statistics
        # for the scalar columns readers filter on
        scalars = [f.name for f in table.schema if not (f.type.num_fields or f.type == "string")]
        buffer = io.BytesIO()
        pq.write_table(table.replace_schema_metadata(metadata), buffer, use_dictionary=False, write_statistics=scalars)
        data = buffer.getvalue()
        atomic_write(self.shard_path(shard), lambda f: f.write(data))
        record = {"sha256": sha256_bytes(data), "ids": spans(table.column("id").to_pylist())}
        atomic_write(self._record_path(shard), lambda f: f.write(json.dumps(record).encode()))

    def complete(self) -> tuple[dict[str, Any], list[Skipped]]:
        """The records of every shard and the examples skipped, by id, once every shard is written:
        ValueError naming the file unless every shard has a record listing its rows' ids, and the
        rows hold every example's id that was not skipped exactly once."""
        records = self.records()
        rows: list[int] = []
        skipped: list[Skipped] = []
        for shard in range(self.plan.shards):
            path = self.shard_path(shard)
            try:
                ids, shard_skipped = _contents(path)
            except Exception as err:  # missing or damaged since it was written
                raise ValueError(f"{path} cannot be read ({type(err).__name__}: {err}); run again to redo it") from err
            record = records.get(self.shard_name(shard), {})
            if not _well_formed(record) or spans(ids) != record["ids"]:
                raise ValueError(f"{path} does not hold the rows its record lists; run again to redo it")
            rows += ids
            skipped += shard_skipped
        left_out = {s.id for s in skipped}
        if rows != [i for i in range(self.plan.examples) if i not in left_out] or len(left_out) != len(skipped):
            raise ValueError(
                f"the shards in {os.path.join(self.path, DATA)} do not hold each example id exactly once; "
                "delete the directory and run again"
            )
        return records, skipped

    def finish(self, card: str, records: Mapping[str, Any], skipped: Iterable[Skipped]) -> str | None:
        """Gather the shard ``records`` into the manifest, write the card and the skipped list (if any;
        its path is returned); remove the record files and the temporary files of killed runs."""
        names = [self.shard_name(s) for s in range(self.plan.shards)]
        manifest = {**self._manifest(), "records": {name: records[name] for name in names}}
        self.create(manifest)
        atomic_write(os.path.join(self.path, "README.md"), lambda f: f.write(card.encode()))
        for shard in range(self.plan.shards):
            Path(self._record_path(shard)).unlink(missing_ok=True)
        remove_stale_temp_files(self.path)
        with contextlib.suppress(OSError):  # not empty: a live process's temporary file
            os.rmdir(os.path.join(self.path, RECORDS))
        rows = [f"{s.id}\t{s.source or ''}\t{' '.join(s.error.split())}\n" for s in skipped]
        path = os.path.join(self.path, SKIPPED)
        if not rows:
            Path(path).unlink(missing_ok=True)  # an earlier run's, of examples now read
            return None
        atomic_write(path, lambda f: f.write(("id\tsource\terror\n" + "".join(rows)).encode()))
        return path
