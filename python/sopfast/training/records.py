"""What a training run writes beside its checkpoints: ``log.jsonl`` (one JSON record per line),
``metrics.csv``, TensorBoard events (``tensorboard/``, when the ``tensorboard`` package is
installed: every value, the run's options as hparams and its ``config.yaml`` as text) and
``training_curves.png`` (one axis per quantity).

A resumed run appends to them; one whose ``log.jsonl`` or ``metrics.csv`` is damaged (not UTF-8, a line
that is no JSON record or CSV row, a cut last line) has the file moved aside (``log.jsonl.damaged-1``),
says so in a warning and starts the file anew: the training state, not the logs, is what it resumes from.
A run folder never holds a model of its own at its top (:func:`check_run_folder`).

Train records come one per optimizer step (their losses are kept on the device and read in one
transfer every ``log_every`` steps) with the loss by term (:class:`~sopfast.training.step_values.StepValues`);
an evaluation record follows the train record of its step.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

from ..integrity import atomic_write_text, listed, save_figure
from ..model.state_files import model_files, move_aside

logger = logging.getLogger(__name__)

CSV_NAME = "metrics.csv"
CURVES_NAME = "training_curves.png"
TENSORBOARD_DIR = "tensorboard"
PENALTIES = ("diversity_penalty", "saliency_penalty", "sufficiency_penalty", "distill_penalty")
CSV_FIELDS = (
    "event",
    "step",
    "epoch",
    "time",
    "loss",
    "task_loss",
    *PENALTIES,
    "grad_norm",
    "lr",
    "distinct_groups",
    "val_loss",
    "val_accuracy",
    "val_agreement",
    "val_mse",
    "val_distinct_groups",
)
#: TensorBoard charts that put one quantity's train and validation values on one axis
TENSORBOARD_LAYOUT = {"losses": {"task loss (train, validation)": ["Multiline", ["train/task_loss", "eval/val_loss"]]}}


class RunRecords:
    """The records of one run: ``log_file`` (JSON lines) always when given; with ``output_dir`` also
    ``metrics.csv``, TensorBoard events and ``training_curves.png``.  Appends to what a resumed run
    wrote before."""

    def __init__(self, log_file: str | os.PathLike | None, output_dir: str | os.PathLike | None):
        self.records: list[dict[str, Any]] = []
        self._json: IO[str] | None = None
        self._csv: IO[str] | None = None
        self._tensorboard: Any = None
        self.output_dir = None if output_dir is None else Path(output_dir)
        if self.output_dir is not None:
            check_run_folder(self.output_dir)
        if log_file is not None:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            self.records = _read_json_lines(Path(log_file))
            self._json = open(log_file, "a", encoding="utf-8")
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            path = self.output_dir / CSV_NAME
            header = _csv_header(path)  # a resumed run keeps the columns it started with
            self._csv = open(path, "a", encoding="utf-8", newline="")
            self._writer = csv.DictWriter(self._csv, fieldnames=header or CSV_FIELDS, extrasaction="ignore")
            if not header:
                self._writer.writeheader()
            self._tensorboard = _summary_writer(self.output_dir / TENSORBOARD_DIR)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (``event``, ``step`` and values) to every record file."""
        self.records.append(record)
        if self._json is not None:
            self._json.write(json.dumps(record) + "\n")
            self._json.flush()
        if self._csv is not None:
            self._writer.writerow(record)
            self._csv.flush()
        if self._tensorboard is not None:
            for key, value in record.items():
                if key not in ("event", "step", "epoch", "time") and isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(f"{record['event']}/{key}", value, record["step"])

    def describe_run(self, entries: dict[str, Any], config_text: str, metric: str) -> None:
        """Give TensorBoard the run's resolved options: ``entries`` as hparams (compared across runs
        against the validation ``metric`` and loss), ``config_text`` (its ``config.yaml``) as text."""
        if self._tensorboard is None:
            return
        from torch.utils.tensorboard.summary import hparams

        values = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in entries.items()}
        metrics = dict.fromkeys((f"eval/val_{metric}", "eval/val_loss"), 0.0)
        for summary in hparams(values, metrics):
            self._tensorboard.file_writer.add_summary(summary)
        self._tensorboard.add_text("config.yaml", f"```yaml\n{config_text}\n```")
        self._tensorboard.add_custom_scalars(TENSORBOARD_LAYOUT)

    def plot(self) -> Path | None:
        """Write ``training_curves.png`` (loss, gradient norm, learning rate and validation metrics over
        the steps); ``None`` without an output directory or records."""
        if self.output_dir is None or not self.records:
            return None
        return plot_training_curves(self.records, self.output_dir / CURVES_NAME)

    def close(self) -> None:
        for handle in (self._json, self._csv):
            if handle is not None:
                handle.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        self._json = self._csv = self._tensorboard = None


def check_run_folder(directory: str | os.PathLike, name: str = "output_dir (--output-dir)") -> None:
    """A ValueError when ``directory`` (named ``name``) holds a model at its top (a backbone's folder, another
    model's): a run writes its own files there (``config.yaml``, ``best/`` …), never beside a model's."""
    found = model_files(directory)
    if found:
        raise ValueError(
            f"{name} {directory} holds a model ({listed(found)}): sopfast writes a run's own files and folders "
            f"(best/, last/, training_state.pt, logs), never into a model's folder; choose another {name}"
        )


def _set_aside(path: Path, why: str) -> None:
    """Move the damaged record file ``path`` aside, saying so."""
    aside = move_aside(path)
    logger.warning(
        "%s is damaged (%s): moved aside to %s and started anew; the run resumes from its training state",
        path,
        why,
        aside.name,
    )


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The records of ``log.jsonl`` (none when it is missing, or damaged: then it is moved aside)."""
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        if not all(isinstance(r, dict) for r in records):
            raise ValueError("a line is not a JSON object")
        if text and not text.endswith("\n"):
            raise ValueError("its last line is cut")
    except ValueError as err:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        _set_aside(path, " ".join(str(err).split()))
        return []
    return records


def _csv_header(path: Path) -> list[str] | None:
    """The columns of an existing ``metrics.csv`` (``None`` when there is none yet, or it was damaged and
    is moved aside)."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    try:
        text = path.read_text(encoding="utf-8")
        rows = list(csv.reader(io.StringIO(text, newline="")))
        if not rows or rows[0][:1] != [CSV_FIELDS[0]]:
            raise ValueError(f"its first row is not a header starting with {CSV_FIELDS[0]!r}")
        if any(len(row) != len(rows[0]) for row in rows[1:]) or not text.endswith("\n"):
            raise ValueError("a row is cut or has other columns than the header")
    except (ValueError, csv.Error) as err:
        _set_aside(path, " ".join(str(err).split()))
        return None
    return rows[0]


def _summary_writer(directory: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("TensorBoard events are not written: install the tensorboard package for them")
        return None
    return SummaryWriter(log_dir=str(directory))


def plot_training_curves(records: list[dict[str, Any]], path: Path) -> Path:
    """A PNG of a run's records, one axis per quantity: the task loss (train and validation: the same
    quantity), the loss training optimises (task loss + penalties), each penalty, the validation
    metric, the distinct groups per input (train and validation), the gradient norm and the learning rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("event") == "train"]
    evals = [r for r in records if r.get("event") == "eval"]
    metric = next((k for k in ("val_accuracy", "val_mse") if any(k in r for r in evals)), None)
    task = "task loss (cross-entropy)" if metric != "val_mse" else "task loss (scaled MSE)"
    specs = [
        (task, [("task_loss", train, "train"), ("val_loss", evals, "validation")]),
        ("training loss (task loss + penalties)", [("loss", train, "train")]),
        *((name.replace("_", " "), [(name, train, "train")]) for name in PENALTIES if any(name in r for r in train)),
        (metric or "validation metric", [(metric, evals, "validation")] if metric else []),
        (
            "distinct groups per input",
            [("distinct_groups", train, "train"), ("val_distinct_groups", evals, "validation")],
        ),
        ("gradient norm", [("grad_norm", train, "train")]),
        ("learning rate", [("lr", train, "train")]),
    ]
    layout_rows = 1 if len(specs) <= 4 else 2
    columns = -(-len(specs) // layout_rows)
    fig, grid = plt.subplots(layout_rows, columns, figsize=(3.5 * columns, 3.1 * layout_rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(specs) :]:
        ax.axis("off")
    for ax, (title, lines) in zip(axes, specs):
        for key, rows, label in lines:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points), marker="o" if rows is evals else None, markersize=3, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return path


CONFIG_NAME = "config.yaml"


def _plain(value: Any) -> Any:
    """``value`` as YAML writes it: numbers, strings, booleans, lists and mappings as they are; anything
    else (a path, a ``torch.device``) as its string."""
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def write_run_config(config: Any, model: Any, extra: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``config.yaml`` in ``config.output_dir``: the resolved model options (``model``: a
    :class:`sopfast.SOP`) and training options (``config``: a resolved
    :class:`~sopfast.training.config.TrainConfig`), the backbone's source and ``extra`` entries (the
    command line's data options, their paths absolute), under the names of ``sopfast train``'s flags, so
    that ``sopfast train --config config.yaml`` runs the same training again — into a new run folder, as
    the output folder is not kept (``--output-dir`` names one).  Returns the entries and the file's text."""
    import yaml

    entries: dict[str, Any] = {}
    source = model.provenance.get("backbone")
    if source is not None:
        entries["backbone"] = source["spec"]
        if source.get("weights"):
            entries["backbone_weights"] = source["weights"]
        if source.get("options"):
            entries["backbone_option"] = dict(source["options"])
    entries.update(extra)
    entries.update(dict(model.config))
    skipped = ("resume", "log_file", "output_dir")  # a re-run writes a new folder (log_file: in it by default)
    entries.update({k: v for k, v in dataclasses.asdict(config).items() if k not in skipped})
    entries = {k: _plain(v) for k, v in entries.items() if v is not None}
    path = Path(config.output_dir) / CONFIG_NAME
    header = (
        "# sopfast train: `sopfast train --config config.yaml` runs this training again in a new run folder "
        "(flags win over it)\n"
    )
    text = yaml.safe_dump(entries, sort_keys=False)
    atomic_write_text(path, header + text)
    return entries, text
