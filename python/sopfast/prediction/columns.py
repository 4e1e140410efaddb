"""One batch of predictions as an Arrow record batch: the columns of a ``sopfast predict`` dataset.

Columns (``B`` rows; ``C`` classes, ``m`` groups, ``d`` features; docs/predict.md has the table):

* ``id`` int64 – the example's position in the dataset; ``source`` string – its file, when known;
* ``label`` int64 (null when the data has none; regression: ``[C]`` float32);
* ``prediction`` int64 – ``argmax`` of ``logits`` (classification);
* ``logits`` ``[C]`` float32 – the model's (SOP's ``ŷ``, or the backbone's);
* ``tokens`` – text whose dataset has a ``tokenizer``: the token string at each position (the feature
  indices of ``groups`` and the attributions), null at padding;
* SOP only: ``groups`` – each group's feature indices (ascending; lists of int32), ``lam`` ``[m]``,
  ``group_scores`` ``[C][m]`` (the selector's sparse weights), ``group_logits`` ``[m][C]`` (the
  backbone on each group), ``used_groups`` – the groups with a non-zero score for the predicted class,
  ``object_fraction`` ``[m]`` – each group's share of features on the object (when the data has object
  masks), ``backbone_prediction`` int64 – the frozen backbone's class on the whole input (classification;
  ``prediction == backbone_prediction`` where SOP agrees with the model it explains), ``attributions`` –
  each feature's ``Σ c·λ·y`` for the predicted class;
* ``<explainer>_attributions`` – a perturbation explainer's attributions of the predicted class.

Attributions are ``[d]`` per feature, or with ``attribution_shape="input"`` ``[H][W]`` per pixel
(images; text stays per token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

#: Columns a SOP model can write besides ``id``, ``source``, ``label``, ``prediction``.
Output = Literal[
    "logits",
    "tokens",
    "groups",
    "lam",
    "group_scores",
    "group_logits",
    "used_groups",
    "object_fraction",
    "backbone_prediction",
    "attributions",
]
OUTPUTS: tuple[str, ...] = get_args(Output)
#: What ``outputs=None`` writes: everything but the per-feature attributions.
DEFAULT_OUTPUTS = OUTPUTS[:-1]
#: Columns that only a SOP model has.
SOP_OUTPUTS = OUTPUTS[2:]
#: What a backbone writes with ``outputs=None``.
BACKBONE_OUTPUTS = OUTPUTS[:2]


@dataclass
class BatchPredictions:
    """One batch's predictions on the host, as numpy arrays (``None``: not computed)."""

    ids: Sequence[int]
    sources: Sequence[str | None]
    labels: np.ndarray | None
    logits: np.ndarray
    classification: bool
    tokens: list[list[str | None]] | None = None
    group_indices: np.ndarray | None = None
    lam: np.ndarray | None = None
    group_scores: np.ndarray | None = None
    group_logits: np.ndarray | None = None
    object_fraction: np.ndarray | None = None
    backbone_logits: np.ndarray | None = None
    attributions: np.ndarray | None = None
    explanation: np.ndarray | None = None


def fixed(values: np.ndarray) -> pa.Array:
    """``[N, a, b, …]`` as ``N`` nested fixed-size lists (``[a][b]…``) sharing the array's buffer."""
    import pyarrow as pa

    array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def ragged(indices: np.ndarray) -> pa.Array:
    """``-1``-padded indices ``[N, m, k]`` as ``N`` lists of ``m`` int32 lists, padding left out."""
    import pyarrow as pa

    n, m, _ = indices.shape
    kept = indices >= 0
    inner = np.concatenate([[0], np.cumsum(kept.sum(-1).reshape(-1))]).astype(np.int32)
    groups = pa.ListArray.from_arrays(pa.array(inner), pa.array(indices[kept].astype(np.int32)))
    return pa.ListArray.from_arrays(pa.array(np.arange(0, n * m + 1, m, dtype=np.int32)), groups)


def positions(mask: np.ndarray) -> pa.Array:
    """``[N, m]`` bool as ``N`` int32 lists of the positions that are set."""
    import pyarrow as pa

    offsets = np.concatenate([[0], np.cumsum(mask.sum(-1))]).astype(np.int32)
    columns = np.broadcast_to(np.arange(mask.shape[1], dtype=np.int32), mask.shape)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(columns[mask]))


def record_batch(p: BatchPredictions, outputs: Sequence[str], explainer: str | None) -> pa.RecordBatch:
    """The columns of ``p`` (module docstring) that ``outputs`` and ``explainer`` ask for."""
    import pyarrow as pa

    n = len(p.ids)
    columns: dict[str, pa.Array] = {
        "id": pa.array(np.asarray(p.ids, dtype=np.int64)),
        "source": pa.array(list(p.sources), pa.string()),
    }
    if p.labels is None:
        columns["label"] = pa.nulls(n, pa.int64())
    elif p.labels.ndim == 1 and np.issubdtype(p.labels.dtype, np.integer):
        columns["label"] = pa.array(p.labels.astype(np.int64))
    else:  # regression targets
        columns["label"] = fixed(p.labels.astype(np.float32))
    predicted = p.logits.argmax(-1)
    if p.classification:
        columns["prediction"] = pa.array(predicted.astype(np.int64))
    wanted = {
        "logits": p.logits,
        "lam": p.lam,
        "group_scores": p.group_scores,
        "group_logits": p.group_logits,
        "object_fraction": p.object_fraction,
        "attributions": p.attributions,
    }
    for name in outputs:
        if name == "tokens" and p.tokens is not None:
            columns[name] = pa.array(p.tokens, pa.list_(pa.string()))
        elif name == "groups" and p.group_indices is not None:
            columns[name] = ragged(p.group_indices)
        elif name == "used_groups" and p.group_scores is not None and p.classification:
            columns[name] = positions(p.group_scores[np.arange(n), predicted] > 0)
        elif name == "backbone_prediction" and p.backbone_logits is not None and p.classification:
            columns[name] = pa.array(p.backbone_logits.argmax(-1).astype(np.int64))
        elif wanted.get(name) is not None:
            columns[name] = fixed(np.asarray(wanted[name], dtype=np.float32))
    if explainer is not None and p.explanation is not None:
        columns[f"{explainer}_attributions"] = fixed(p.explanation.astype(np.float32))
    return pa.RecordBatch.from_pydict(columns)
