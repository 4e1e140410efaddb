"""Trainer callbacks in the style of Hugging Face's ``TrainerCallback``: subclass
:class:`TrainerCallback`, override the events you need, pass ``callbacks=[MyCallback()]`` to
:func:`sopfast.train`.  Each event gets the :class:`~sopfast.training.trainer.Trainer` (set
``trainer.should_stop = True`` to stop after the current step; the state is saved) and the event's
record (a dict, also what ``log.jsonl`` holds for it).  This module names the trainer's parts a callback
reads (:class:`TrainerView`) without importing the trainer, which imports it.

The functions of earlier releases, ``fn(trainer, event, record)`` with the events ``"step"``,
``"log"``, ``"eval"`` and ``"end"``, still work for this release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from ..model.sop import SOP
    from .config import TrainConfig


class TrainerView(Protocol):
    """What a callback is given: the running :class:`~sopfast.training.trainer.Trainer`, here by the parts
    callbacks read — the model, the resolved options, the optimizer, the counters, the validation
    metrics, and ``should_stop``, which a callback sets to stop after the current step."""

    model: SOP
    config: TrainConfig
    optimizer: torch.optim.Optimizer
    step: int
    epoch: int
    metrics: dict[str, float]
    best_metric: float | None
    best_step: int | None
    should_stop: bool


Record = dict[str, Any]
LegacyCallback = Callable[[TrainerView, str, Record], None]
#: The trainer's events and the :class:`TrainerCallback` method each calls.
EVENTS = {
    "begin": "on_train_begin",
    "step": "on_step_end",
    "log": "on_log",
    "eval": "on_evaluate",
    "save": "on_save",
    "end": "on_train_end",
}
#: The events the deprecated ``fn(trainer, event, record)`` callbacks receive.
LEGACY_EVENTS = ("step", "log", "eval", "end")


class TrainerCallback:
    """Override the events you need; every method is a no-op here."""

    def on_train_begin(self, trainer: TrainerView, record: Record) -> None:
        """Before the first step (after a resume: the restored ``step``), with ``step`` and ``total_steps``."""

    def on_step_end(self, trainer: TrainerView, record: Record) -> None:
        """After every optimizer step, with ``step``, ``epoch`` and ``lr``."""

    def on_log(self, trainer: TrainerView, record: Record) -> None:
        """After the per-step train records are written, with the last one (``loss``, ``grad_norm``, ``lr``)."""

    def on_evaluate(self, trainer: TrainerView, record: Record) -> None:
        """After validation, with the ``val_*`` metrics, ``best`` and ``best_step``."""

    def on_save(self, trainer: TrainerView, record: Record) -> None:
        """After a file is written: ``what`` is ``"state"`` (the training state), ``"best"`` or ``"last"``
        (a checkpoint), ``path`` where."""

    def on_train_end(self, trainer: TrainerView, record: Record) -> None:
        """After the last step, the final evaluation and the last checkpoint, with ``best`` and ``best_step``."""


class _Legacy(TrainerCallback):
    """A deprecated ``fn(trainer, event, record)``, called for :data:`LEGACY_EVENTS`."""

    def __init__(self, fn: LegacyCallback):
        self.fn = fn

    def on_step_end(self, trainer: TrainerView, record: Record) -> None:
        self.fn(trainer, "step", record)

    def on_log(self, trainer: TrainerView, record: Record) -> None:
        self.fn(trainer, "log", record)

    def on_evaluate(self, trainer: TrainerView, record: Record) -> None:
        self.fn(trainer, "eval", record)

    def on_train_end(self, trainer: TrainerView, record: Record) -> None:
        self.fn(trainer, "end", record)


def as_callbacks(callbacks: Iterable[TrainerCallback | LegacyCallback] | None) -> list[TrainerCallback]:
    """``callbacks`` as :class:`TrainerCallback` s: functions wrapped (with a ``DeprecationWarning``),
    anything else a TypeError naming ``callbacks`` and what is allowed."""
    if callbacks is not None and not isinstance(callbacks, (list, tuple)):
        raise TypeError(
            f"callbacks must be a list of sopfast.TrainerCallback instances, got {callbacks!r}; wrap one in [...]"
        )
    out: list[TrainerCallback] = []
    for callback in callbacks or []:
        if isinstance(callback, TrainerCallback):
            out.append(callback)
        elif callable(callback) and not isinstance(callback, type):
            warnings.warn(
                "callbacks as functions fn(trainer, event, record) are deprecated and will stop working in the "
                "next release: subclass sopfast.TrainerCallback and override on_step_end, on_log, on_evaluate, "
                "on_save or on_train_end",
                DeprecationWarning,
                stacklevel=3,
            )
            out.append(_Legacy(callback))
        else:
            raise TypeError(
                f"callbacks must be sopfast.TrainerCallback instances (or, deprecated, functions "
                f"fn(trainer, event, record)), got {callback!r}"
            )
    return out


def emit(callbacks: Iterable[TrainerCallback], trainer: TrainerView, event: str, record: Record) -> None:
    """Call each callback's method for ``event`` (a key of :data:`EVENTS`)."""
    method = EVENTS[event]
    for callback in callbacks:
        getattr(callback, method)(trainer, record)
