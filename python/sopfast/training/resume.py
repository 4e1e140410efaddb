"""Resuming a run from its training state: which file, and whether the settings allow it.

A resumed run must continue the saved one exactly: the same seed, batches, accumulation, learning
rate and schedule (the :func:`fingerprint`).  One setting may grow: ``epochs`` — re-running a
finished run with more epochs continues it, its learning-rate schedule stretched to the new
length from the step where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model.checkpoint import STATE_NAME
from .config import STATE_FORMAT, TrainConfig

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
}


def fingerprint(
    config: TrainConfig,
    *,
    world_size: int,
    batch_size: int | None,
    batches_per_epoch: int,
    warmup_steps: int,
    num_heads: int,
) -> dict[str, Any]:
    """Settings a resumed run must share with the saved one to continue it exactly."""
    return {
        "seed": config.seed,
        "world_size": world_size,
        "batch_size": batch_size,
        "grad_accum": config.grad_accum,
        "batches_per_epoch": batches_per_epoch,
        "epochs": config.epochs,
        "lr": config.lr,
        "schedule": config.schedule,
        "warmup_steps": warmup_steps,
    } | ({"head_schedule": config.head_schedule} if num_heads > 1 else {})


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
    saved = state["fingerprint"]
    changed = {
        k: (saved.get(k), v)
        for k, v in now.items()
        if saved.get(k) != v and not (k in GROWABLE and isinstance(saved.get(k), int) and v > saved[k])
    }
    if changed:
        names = ", ".join(f"{_FLAGS.get(k, k)}: {a!r} → {b!r}" for k, (a, b) in changed.items())
        raise ValueError(
            f"cannot resume from {path}: settings differ from the saved run ({names}; saved → now); use the "
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
