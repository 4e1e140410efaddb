"""When a run stops, and why: early stopping on the validation metric (``patience``) and the reason a
run reports (``"epochs"``, ``"max_steps"``, ``"early_stopping"``, ``"callback"``).

Early stopping reads the validation metric **smoothed** — the mean of the last :data:`WINDOW`
evaluations — and never stops before ``min_steps`` optimizer steps (:func:`sopfast.train` with
``epochs=None``: half the planned steps): on a small validation split one
prediction more or less (a rounding difference between thread counts, say) moves the raw metric by a
step, and a rule on the raw metric then stops a run, and keeps a model, that another machine would not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Evaluations the early-stopping metric is averaged over.
WINDOW = 3


@dataclass
class Stopping:
    """Evaluations since the best smoothed metric and why the run stopped (``patience``: stop after that
    many evaluations without a better smoothed metric, once ``min_steps`` steps are done; ``None``: never)."""

    patience: int | None
    evals_since_best: int = 0
    reason: str = "epochs"
    min_steps: int = 0
    recent: list[float] = field(default_factory=list)
    best_smoothed: float | None = None

    def evaluated(self, value: float, larger_is_better: bool, step: int, more_planned: bool) -> bool:
        """Count one evaluation of the metric ``value`` at optimizer step ``step``; True when the run must
        stop early (with more steps ``more_planned``)."""
        self.recent = [*self.recent, float(value)][-WINDOW:]
        smoothed = sum(self.recent) / len(self.recent)
        best = self.best_smoothed
        if best is None or (smoothed > best if larger_is_better else smoothed < best):
            self.best_smoothed, self.evals_since_best = smoothed, 0
        else:
            self.evals_since_best += 1
        waited = self.patience is not None and self.evals_since_best >= self.patience
        if waited and more_planned and step >= self.min_steps:
            self.reason = "early_stopping"
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs to decide as an uninterrupted run would."""
        return {
            "evals_since_best": self.evals_since_best,
            "recent": list(self.recent),
            "best_smoothed": self.best_smoothed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a state saved before smoothing existed: the count alone)."""
        self.evals_since_best = int(state.get("evals_since_best", 0))
        self.recent = [float(v) for v in state.get("recent", [])]
        best = state.get("best_smoothed")
        self.best_smoothed = None if best is None else float(best)

    def describe(
        self, step: int, total_steps: int, epochs: int, metric: str, best: tuple[float | None, int | None], max_steps
    ) -> str:
        """Where and why training stopped, in words (``best``: the best validation value and its step)."""
        where = f"training stopped at step {step} of {total_steps} planned ({epochs} epochs)"
        value, best_step = best
        best_text = "" if value is None else f"; best val_{metric} {value:.4f} at step {best_step}"
        why = {
            "epochs": "the planned epochs are done",
            "max_steps": f"max_steps={max_steps} reached",
            "early_stopping": f"val_{metric}, averaged over the last {WINDOW} evaluations, did not improve in "
            f"{self.patience} evaluations (patience)",
            "callback": "a callback asked it to stop",
        }[self.reason]
        return f"{where}: {why}{best_text}"
