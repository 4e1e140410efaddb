"""The options of :func:`sopfast.train` (:class:`TrainConfig`), the learning-rate schedules and what
a run returns."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from ..checks import check_bool, check_choice, check_int, check_number, check_path
from ..defaults import BATCH_SIZE
from ..devices import check_device
from ..model.recipes import Recipe
from ..schedules import SCHEDULES

HEAD_SCHEDULES = ("phases", "epochs")
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
METRICS = {"accuracy": "max", "loss": "min", "mse": "min"}
STATE_FORMAT = 1
#: The largest ``lr``: AdamW moves every weight by about ``lr`` per step, so above 1 a step overwrites the
#: weights (``lr`` 1e6 with ``grad_clip=None`` trained to a model that fails on every input).
MAX_LR = 1.0
#: ``epochs=None``: at least this many epochs, about this many evaluations, and this patience.
MIN_EPOCHS = 3
EVALUATIONS = 20
DEFAULT_PATIENCE = 5


@dataclass
class TrainConfig:
    """Options of :func:`train` (all keyword-only there).

    Args:
        epochs: passes over ``train_data``; the learning-rate schedule spans all of them.  ``None``
            (default): set by the data — the fewest whole epochs (at least 3) that make ``min_steps``
            optimizer steps, stopped early after ``patience`` evaluations without a better validation
            metric (the run records why it stopped).
        min_steps: with ``epochs=None``, the least number of optimizer steps the schedule plans
            (a few hundred images make ~20 steps an epoch: 3 epochs would leave SOP untrained).
        patience: stop after this many evaluations without a better validation metric (``best/`` keeps
            the best model); ``None``: 5 with ``epochs=None`` and ``val_data``, else never.
        diagnose: before the first step, measure the frozen backbone on the validation data (or the
            training data): its accuracy on whole inputs and on random groups of the model's ``tau``
            (:func:`sopfast.diagnose`); printed, logged and saved as ``diagnosis.json``.
        diagnose_examples: how many examples the diagnostic measures.
        lr: AdamW's learning rate (default: the model's recipe — 1e-3 for ``"sopfast"``, the paper's
            5e-6 for ``"paper"``; at most :data:`MAX_LR`, 1).
        weight_decay: AdamW's decoupled weight decay of the trainable parameters.
        batch_size: examples per process and step when ``train_data``/``val_data`` are Datasets
            (a DataLoader keeps its own; default 32, as ``sopfast train``).
        warmup_steps: linear warm-up length in optimizer steps (give this or ``warmup_ratio``).
        warmup_ratio: linear warm-up length as a fraction of all steps (default: the model's recipe's).
        schedule: ``"cosine"`` (decay to 0), ``"inverse_sqrt"`` or ``"constant"`` after warm-up.
        grad_clip: max global gradient norm (``None``: no clipping).
        grad_accum: micro-batches per optimizer step.
        amp: ``None``, ``"bf16"`` or ``"fp16"`` autocast (fp16 on CUDA uses a GradScaler).
        eval_every: evaluate every N optimizer steps (``None``: at the end of each epoch; with
            ``epochs=None``, 20 times over the planned steps).
        save_every: write the training state every N steps (also at each epoch end and at the end).
        log_every: write the per-step train records (loss, gradient norm, learning rate) every N
            steps (their values stay on the device in between: one transfer per N steps).
        metric: ``"accuracy"``, ``"loss"`` or ``"mse"`` picks the best checkpoint
            (``None``: accuracy for classification, mse for regression).
        output_dir: the run folder: checkpoints, training state, ``config.yaml``, ``log.jsonl``,
            ``metrics.csv``, TensorBoard events, ``training_curves.png`` (``None``: nothing is written).
        resume: ``True`` continues from ``output_dir``'s training state if there is one;
            ``False`` starts afresh; a path names a state file (or its directory) that must exist.
        seed: seeds python/numpy/torch and the data order.
        progress: show a tqdm bar (rank 0 only).
        log_file: JSON-lines log (default ``output_dir/log.jsonl``).
        device: ``None`` picks ``cuda:LOCAL_RANK`` when available, else the CPU.
        max_steps: stop after this many optimizer steps in all (the schedule still spans ``epochs``).
        find_unused_parameters: passed to DDP; ``None`` probes one backward pass under DDP to see
            whether some trainable parameter gets no gradient (CNN projections have such layers).
        head_schedule: which generator head trains when ``num_heads = H > 1``: ``"phases"`` (the
            authors' schedule: the steps are cut into ``H`` equal phases, head ``h`` trains in phase
            ``h``, and warm-up and decay of the learning rate restart in every phase) or
            ``"epochs"`` (head ``epoch mod H``, one schedule over all steps).
    """

    epochs: int | None = None
    min_steps: int = 1000
    patience: int | None = None
    diagnose: bool = True
    diagnose_examples: int = 128
    lr: float | None = None
    weight_decay: float = 0.01
    batch_size: int | None = BATCH_SIZE
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    schedule: Literal["cosine", "inverse_sqrt", "constant"] = "cosine"
    grad_clip: float | None = 1.0
    grad_accum: int = 1
    amp: Literal["bf16", "fp16"] | None = None
    eval_every: int | None = None
    save_every: int | None = 500
    log_every: int = 10
    metric: Literal["accuracy", "loss", "mse"] | None = None
    output_dir: str | os.PathLike | None = None
    resume: bool | str | os.PathLike = True
    seed: int = 0
    progress: bool = True
    log_file: str | os.PathLike | None = None
    device: str | torch.device | None = None
    max_steps: int | None = None
    find_unused_parameters: bool | None = None
    head_schedule: Literal["phases", "epochs"] = "phases"

    def __post_init__(self) -> None:
        check_int("epochs", self.epochs, 1, optional=True)
        check_int("min_steps", self.min_steps, 1)
        check_int("patience", self.patience, 1, optional=True)
        check_int("diagnose_examples", self.diagnose_examples, 1)
        check_number("lr", self.lr, 0.0, MAX_LR, above=True, optional=True)
        check_number("weight_decay", self.weight_decay, 0.0)
        check_number("warmup_ratio", self.warmup_ratio, 0.0, optional=True)
        if self.warmup_ratio is not None and not self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if self.warmup_steps is not None and self.warmup_ratio:
            raise ValueError("give warmup_steps or warmup_ratio, not both")
        check_number("grad_clip", self.grad_clip, 0.0, above=True, optional=True)
        check_bool("progress", self.progress)
        check_bool("diagnose", self.diagnose)
        check_bool("find_unused_parameters", self.find_unused_parameters, optional=True)
        check_path("output_dir", self.output_dir, optional=True, directory=True)
        check_path("log_file", self.log_file, optional=True, directory=False)
        if not isinstance(self.resume, bool):
            check_path("resume (True, False or a path)", self.resume)
        check_int("batch_size", self.batch_size, 1, optional=True)
        check_int("warmup_steps", self.warmup_steps, 0, optional=True)
        check_int("grad_accum", self.grad_accum, 1)
        check_int("eval_every", self.eval_every, 1, optional=True)
        check_int("save_every", self.save_every, 1, optional=True)
        check_int("log_every", self.log_every, 1)
        check_int("max_steps", self.max_steps, 1, optional=True)
        check_int("seed", self.seed, 0)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("head_schedule", self.head_schedule, HEAD_SCHEDULES)
        check_choice("amp", self.amp, (None, *AMP_DTYPES))
        if self.device is not None:
            check_device(self.device)
        check_choice("metric", self.metric, (None, *METRICS))
        if self.output_dir is not None:
            self.output_dir = output_dir = Path(self.output_dir)
            if self.log_file is None:
                self.log_file = output_dir / "log.jsonl"

    def resolved(self, recipe: Recipe, modality: str | None = None) -> TrainConfig:
        """These options with ``lr`` and the warm-up (unless ``warmup_steps`` is given) filled in from
        ``recipe`` where they are ``None`` (its defaults for ``modality``, "image" or "text")."""
        defaults = recipe.training_for(modality)
        lr = defaults["lr"] if self.lr is None else self.lr
        ratio = self.warmup_ratio
        if ratio is None:
            ratio = 0.0 if self.warmup_steps is not None else defaults["warmup_ratio"]
        return replace(self, lr=lr, warmup_ratio=ratio)

    @property
    def _output_path(self) -> Path | None:
        """``output_dir`` typed as the Path ``__post_init__`` made of it."""
        return None if self.output_dir is None else Path(self.output_dir)

    def planned_epochs(self, steps_per_epoch: int) -> int:
        """``epochs``, or with ``epochs=None`` the fewest whole epochs (at least :data:`MIN_EPOCHS`) that
        make ``min_steps`` optimizer steps of ``steps_per_epoch``."""
        if self.epochs is not None:
            return self.epochs
        return max(MIN_EPOCHS, math.ceil(self.min_steps / steps_per_epoch))

    def eval_interval(self, steps_per_epoch: int) -> int | None:
        """Optimizer steps between evaluations (``None``: at each epoch's end)."""
        if self.eval_every is not None or self.epochs is not None:
            return self.eval_every
        return math.ceil(self.planned_epochs(steps_per_epoch) * steps_per_epoch / EVALUATIONS)

    def early_stopping_patience(self, has_val_data: bool) -> int | None:
        """Evaluations without improvement after which training stops (``None``: never)."""
        if not has_val_data:
            return None
        if self.patience is not None:
            return self.patience
        return DEFAULT_PATIENCE if self.epochs is None else None


@dataclass
class TrainResult:
    """What :func:`train` returns: where training stopped, why (``stop_reason``: ``"epochs"``,
    ``"max_steps"``, ``"early_stopping"`` or ``"callback"``), the best validation metric and the
    backbone diagnostic (:func:`sopfast.diagnose`, as a dict) when one ran."""

    step: int
    epoch: int
    best_metric: float | None
    best_step: int | None
    metrics: dict[str, float] = field(default_factory=dict)
    output_dir: Path | None = None
    stop_reason: str = "epochs"
    diagnosis: dict[str, Any] | None = None


def resolve_metric(metric: str | None, task: str) -> str:
    """The validation metric to select checkpoints by (checked against the model's task)."""
    if metric is None:
        return "accuracy" if task == "classification" else "mse"
    if (metric, task) in (("accuracy", "regression"), ("mse", "classification")):
        raise ValueError(f"metric={metric!r} does not apply to a {task} model")
    return metric
