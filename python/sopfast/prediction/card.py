"""The dataset card (``README.md``) of a prediction run: what was predicted, the columns, and how to
query them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..version import __version__

#: What each column holds (``C`` classes, ``m`` groups, ``d`` features).
COLUMN_DOCS = {
    "id": "int64: the example's position in the dataset",
    "source": "string: the example's file, when the data names one",
    "label": "int64: the class id the data gives (null when it gives none)",
    "prediction": "int64: the predicted class, `argmax(logits)`",
    "logits": "[C] float32: the model's logits (SOP: `Σ_i c·λ·y`)",
    "tokens": "list of string: each position's token (what `groups` and attributions index; null at padding)",
    "groups": "m lists of int32: each group's feature indices (patches / tokens / cells), ascending",
    "lam": "[m] float32: each group's λ",
    "group_scores": "[C][m] float32: the selector's sparse weight of each group, per class",
    "group_logits": "[m][C] float32: the frozen backbone's logits on each group alone",
    "used_groups": "list of int32: the groups with a non-zero score for the predicted class",
    "object_fraction": "[m] float32: the share of each group's features that lie on the object",
    "backbone_prediction": "int64: the frozen backbone's class on the whole input (SOP agrees where it equals "
    "`prediction`)",
    "attributions": "[d] (or [H][W]) float32: each feature's Σ c·λ·y for the predicted class",
}

#: How the queries read the rows.
QUERY_HEADER = """\
import pandas as pd

df = pd.read_parquet("OUT/data")  # or datasets.load_dataset("parquet", data_dir="OUT")["train"].to_pandas()
"""

#: Four questions about a model, asked of its predictions with pandas (docs/predict.md runs them),
#: each with the columns it reads.
QUERIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("object_fraction", "used_groups"),
        """\
# 1. Off-object groups: predictions resting on a group that lies mostly off the object
off = df[[any(f[g] < 0.5 for g in used) for f, used in zip(df.object_fraction, df.used_groups)]]
""",
    ),
    (
        ("used_groups",),
        """\
# 2. One-group predictions: the predicted class is carried by a single group
single = df[df.used_groups.map(len) == 1]
""",
    ),
    (
        ("groups", "used_groups", "prediction"),
        """\
# 3. Per-class group sizes: features per group and in the union of the used groups, by predicted class
df["group_size"] = df.groups.map(lambda groups: sum(map(len, groups)) / len(groups))
df["evidence"] = [len(set().union(*(gs[g] for g in used))) for gs, used in zip(df.groups, df.used_groups)]
sizes = df.groupby("prediction")[["group_size", "evidence"]].mean()
""",
    ),
    (
        ("prediction", "backbone_prediction"),
        """\
# 4. Agreement: where SOP predicts what the backbone it explains predicts, and the inputs where it does not
agreement = (df.prediction == df.backbone_prediction).mean()
disagree = df[df.prediction != df.backbone_prediction]
""",
    ),
)


def queries(columns: Sequence[str]) -> str | None:
    """The code of the :data:`QUERIES` whose columns are all among ``columns`` (``None``: none is)."""
    chosen = [text for needs, text in QUERIES if set(needs) <= set(columns)]
    return "\n".join([QUERY_HEADER, *chosen]) if chosen else None


def card(
    *,
    model: str,
    data: str,
    examples: int,
    rows: int,
    skipped: int,
    shards: int,
    columns: Sequence[str],
    settings: Mapping[str, Any],
    explainer: str | None,
) -> str:
    """The README.md of an output directory."""
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files: data/train-*.parquet",
        "tags: [sopfast, predictions, explanations]",
        "---",
        f"# Predictions of {model}",
        "",
        f"Data: {data}. {rows} of {examples} examples in {shards} Parquet shards (`data/`), one row per example"
        + (f"; {skipped} could not be read (listed in `skipped.tsv`)." if skipped else "."),
        f"Written by `sopfast predict` (sopfast {__version__}); settings: "
        + ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None)
        + ".",
        "",
        "| column | content |",
        "|---|---|",
    ]
    for name in columns:
        if name.endswith("_attributions") and explainer is not None:
            text = f"[d] (or [H][W]) float32: {explainer}'s attributions of the predicted class"
        else:
            text = COLUMN_DOCS.get(name, "")
        lines.append(f"| `{name}` | {text} |")
    code = queries(columns)
    lines += ["", "## Queries", "", "```python", code.rstrip(), "```"] if code else []
    return "\n".join([*lines, ""])
