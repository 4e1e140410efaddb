"""Resuming a run from its training state: which file, and whether the settings allow it.

A resumed run must continue the saved one exactly: the same seed, batches, accumulation, optimizer,
learning rate and schedule, the same model options (after the recipe) and the same training data
(its count and a hash of its examples, :func:`sopfast.data.identity.data_identity`): the
:func:`fingerprint`.  One setting may grow: ``epochs`` — re-running a finished run with more epochs
continues it, its learning-rate schedule stretched to the new length from the step where it stopped.
A training state of sopfast 0.3.0 recorded fewer settings; the ones it has are compared.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..data.identity import data_identity, describe_identity
from ..integrity import listed
from ..model.checkpoint import STATE_NAME, model_config
from .config import STATE_FORMAT, TrainConfig
from .guards import check_optimizer_state

# the settings that may grow between a run and its continuation
GROWABLE = ("epochs",)
# how a user changes each fingerprint setting (Python keyword / command-line flag)
_FLAGS = {
    "seed": "seed (--seed)",
    "world_size": "the number of processes",
    "batch_size": "batch_size (--batch-size)",
    "grad_accum": "grad_accum (--grad-accum)",
    "batches_per_epoch": "the training data (--data, --limit)",
    "epochs": "epochs (--epochs)",
    "lr": "lr (--lr)",
    "schedule": "schedule (--schedule)",
    "warmup_steps": "warmup_steps/warmup_ratio (--warmup-steps, --warmup-ratio)",
    "head_schedule": "head_schedule (--head-schedule)",
    "data": "the training data (--data, --limit, --train-split, --holdout)",
}
# the settings a training state of sopfast 0.3.0 recorded
_LEGACY = tuple(k for k in _FLAGS if k != "data")
# TrainConfig fields that change the weights a run ends with (besides those above)
_TRAINING = ("weight_decay", "grad_clip", "amp")
# SOP options that do not change what the model computes (how it chunks, what it recomputes)
_NOT_COMPUTATION = ("group_batch_size", "checkpoint_projection")
# what a training state must hold to be resumed
REQUIRED = (
    "format",
    "step",
    "epoch",
    "batches_done",
    "best_metric",
    "best_step",
    "fingerprint",
    "backbone_sha256",
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "rng",
)
RNG_KEYS = ("python", "numpy", "torch", "cuda")


def _flag(key: str) -> str:
    """How a user changes fingerprint entry ``key`` (``model.tau`` → ``tau (--tau)``)."""
    if key in _FLAGS:
        return _FLAGS[key]
    name = key.split(".", 1)[-1]
    return f"{name} (--{name.replace('_', '-')})"


def _plain(value: Any) -> Any:
    """``value`` as JSON has it (tuples as lists; anything else JSON cannot hold as its repr)."""
    return json.loads(json.dumps(value, default=repr))


def model_options(model: Any) -> dict[str, Any]:
    """The options of ``model`` (a :class:`sopfast.SOP`) that make its computation: its config after the
    recipe, the current ``num_groups`` / ``tau`` / ``mode`` / ``deletion``, and its adapter."""
    config = model_config(model, backbone_sha256="-")["config"]
    options = {k: v for k, v in config.items() if k not in _NOT_COMPUTATION}
    return _plain({**options, "adapter": type(model.adapter).__name__})


def fingerprint(
    config: TrainConfig,
    *,
    world_size: int,
    batch_size: int | None,
    batches_per_epoch: int,
    warmup_steps: int,
    num_heads: int,
    model: Any = None,
    data: Any = None,
) -> dict[str, Any]:
    """Settings a resumed run must share with the saved one to continue it exactly (with ``model``, its
    options as ``model.<name>``; with ``data``, the training data's identity)."""
    extra: dict[str, Any] = {f"training.{k}": getattr(config, k) for k in _TRAINING}
    if model is not None:
        extra.update({f"model.{k}": v for k, v in model_options(model).items()})
    if data is not None:
        extra["data"] = data_identity(data)
    return (
        extra
        | {
            "seed": config.seed,
            "world_size": world_size,
            "batch_size": batch_size,
            "grad_accum": config.grad_accum,
            "batches_per_epoch": batches_per_epoch,
            "epochs": config.epochs,
            "lr": config.lr,
            "schedule": config.schedule,
            "warmup_steps": warmup_steps,
        }
        | ({"head_schedule": config.head_schedule} if num_heads > 1 else {})
    )


def _shown(key: str, value: Any) -> str:
    return describe_identity(value) if key == "data" and value is not None else repr(value)


def run_identity(model: Any, data: Any) -> dict[str, Any]:
    """The fingerprint entries of ``model`` (a :class:`sopfast.SOP`: its options as ``model.<name>``) and of
    the training ``data`` (its identity, :func:`sopfast.data.identity.data_identity`)."""
    return {**{f"model.{k}": v for k, v in model_options(model).items()}, "data": data_identity(data)}


def resume_path(config: TrainConfig) -> Path | None:
    """The training state to resume from: ``resume`` as a path (it must exist), or ``output_dir``'s
    state when ``resume`` is True and there is one, or ``None``."""
    resume, output_dir = config.resume, config._output_path
    if resume is False:
        return None
    if resume is True:
        path = None if output_dir is None else output_dir / STATE_NAME
        return path if path is not None and path.is_file() else None
    return Path(resume)


def check_resumable(path: Path, state: dict[str, Any], now: dict[str, Any], batches_per_epoch: int) -> None:
    """Raise ValueError (naming the setting, saved → now, and how to start afresh) when ``state`` cannot
    be continued with the fingerprint ``now``."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path} is not a sopfast training state (format {state.get('format')!r})")
    missing = [k for k in REQUIRED if k not in state]
    rng = state.get("rng")
    missing += [f"rng.{k}" for k in RNG_KEYS if isinstance(rng, dict) and k not in rng]
    if missing or not isinstance(rng, dict) or not isinstance(state["fingerprint"], dict):
        raise ValueError(
            f"cannot resume from {path}: the training state lacks "
            f"{listed(missing or ['rng or fingerprint mappings'])}; start afresh with resume=False (--no-resume)"
        )
    check_optimizer_state(path, state["optimizer"])
    _check_tracking(path, state)
    saved = state["fingerprint"]
    newer = [k for k in saved if k not in _LEGACY]
    if "sha256" not in state and newer:
        raise ValueError(
            f"cannot resume from {path}: it holds no sha256 entry, yet records {listed(newer)}, which only sopfast "
            "0.4 and later record, and they seal every state: its checksum was removed; start afresh with "
            "resume=False (--no-resume)"
        )
    # a sealed state (sopfast > 0.3.0) records every setting; an older one only some
    compared = now if "sha256" in state else {k: v for k, v in now.items() if k in saved or k in _LEGACY}
    changed = {
        k: (saved.get(k), v)
        for k, v in compared.items()
        if saved.get(k) != v and not (k in GROWABLE and isinstance(saved.get(k), int) and v > saved[k])
    }
    if changed:
        names = "; ".join(f"{_flag(k)}: {_shown(k, a)} → {_shown(k, b)}" for k, (a, b) in changed.items())
        raise ValueError(
            f"cannot resume from {path}: this run differs from the saved one ({names}; saved → now); use the "
            "same settings (only --epochs may grow), or start afresh with resume=False (--no-resume) or "
            "another output_dir (--output-dir)"
        )
    counters: dict[str, Any] = {k: state.get(k) for k in ("step", "epoch", "batches_done")}  # checked next
    if (
        not all(isinstance(v, int) and v >= 0 for v in counters.values())
        or counters["batches_done"] >= batches_per_epoch
    ):
        raise ValueError(
            f"cannot resume from {path}: its position {counters} is not inside an epoch of {batches_per_epoch} batches"
        )


def _check_tracking(path: Path, state: dict[str, Any]) -> None:
    """A ValueError naming the file when the best metric, its step or the evaluations since are no numbers
    of their kind (a corrupted or edited state)."""
    best, best_step, since = state["best_metric"], state["best_step"], state.get("evals_since_best", 0)
    bad = []
    if best is not None and (isinstance(best, bool) or not isinstance(best, (int, float)) or not math.isfinite(best)):
        bad.append(f"best_metric is {best!r}, not a finite number or None")
    if best_step is not None and (isinstance(best_step, bool) or not isinstance(best_step, int) or best_step < 0):
        bad.append(f"best_step is {best_step!r}, not a step (an integer >= 0) or None")
    if isinstance(since, bool) or not isinstance(since, int) or since < 0:
        bad.append(f"evals_since_best is {since!r}, not an integer >= 0")
    recent, smoothed = state.get("recent", []), state.get("best_smoothed")
    if not isinstance(recent, list) or not all(_finite_number(v) for v in recent):
        bad.append(f"recent is {recent!r}, not a list of finite numbers")
    if smoothed is not None and not _finite_number(smoothed):
        bad.append(f"best_smoothed is {smoothed!r}, not a finite number or None")
    if bad:
        raise ValueError(
            f"cannot resume from {path}: {'; '.join(bad)} (a corrupted or edited state); start afresh with "
            "resume=False (--no-resume)"
        )


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def resume_message(path: Path, step: int, total_steps: int, max_steps: int | None) -> str:
    """What a resumed run says: where it continues, and what a finished run does when run again."""
    last = total_steps if max_steps is None else min(max_steps, total_steps)
    text = f"resuming from step {step} of {last} ({path})"
    if step >= last:
        text += (
            ": that run is finished, so this only evaluates and saves it again (a larger --epochs continues it; "
            "--no-resume or another --output-dir starts afresh)"
        )
    return text
