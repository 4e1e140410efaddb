"""What a training run writes beside its checkpoints: ``log.jsonl`` (one JSON record per line),
``metrics.csv``, TensorBoard events (``tensorboard/``, when the ``tensorboard`` package is
installed: every value, the run's options as hparams and its ``config.yaml`` as text) and
``training_curves.png`` (one axis per quantity).

Train records come one per optimizer step (their losses are kept on the device and read in one
transfer every ``log_every`` steps) with the loss by term (:class:`~sopfast.training.step_values.StepValues`);
an evaluation record follows the train record of its step.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

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
    "val_loss",
    "val_accuracy",
    "val_agreement",
    "val_mse",
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


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _csv_header(path: Path) -> list[str] | None:
    """The columns of an existing ``metrics.csv`` (``None`` when there is none yet)."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    with open(path, encoding="utf-8", newline="") as f:
        return next(csv.reader(f), None)


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
    metric, the gradient norm and the learning rate."""
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
    fig.savefig(path, dpi=100)
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
    path.write_text(header + text, encoding="utf-8")
    return entries, text
