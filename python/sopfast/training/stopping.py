"""When a run stops, and why: early stopping on the validation metric (``patience``) and the reason a
run reports (``"epochs"``, ``"max_steps"``, ``"early_stopping"``, ``"callback"``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stopping:
    """Evaluations since the best one and why the run stopped (``patience``: stop after that many
    evaluations without improvement; ``None``: never)."""

    patience: int | None
    evals_since_best: int = 0
    reason: str = "epochs"

    def evaluated(self, improved: bool, more_planned: bool) -> bool:
        """Count one evaluation; True when the run must stop early (with more steps ``more_planned``)."""
        self.evals_since_best = 0 if improved else self.evals_since_best + 1
        if self.patience is not None and self.evals_since_best >= self.patience and more_planned:
            self.reason = "early_stopping"
            return True
        return False

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
            "early_stopping": f"val_{metric} did not improve in {self.patience} evaluations (patience)",
            "callback": "a callback asked it to stop",
        }[self.reason]
        return f"{where}: {why}{best_text}"
