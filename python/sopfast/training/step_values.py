"""The per-step values of a training run — the loss by term and the gradient norm — kept on the device
and read back in one transfer when the run writes its records (no host sync per step)."""

from __future__ import annotations

from collections.abc import Callable

import torch


class StepValues:
    """Sums a step's micro-batch losses by term (:meth:`add`), closes each optimizer step with its
    gradient norm (:meth:`end_step`) and turns the steps not yet written into train records (:meth:`flush`).

    A record holds ``loss`` (what the step optimised: the task loss plus the training penalties),
    ``task_loss`` (cross-entropy, or the scaled MSE: the quantity the validation loss ``val_loss`` is) and
    one ``<name>_penalty`` per penalty of :meth:`sopfast.model.output.SOPOutput.loss_terms`; the trainer
    adds ``distinct_groups``, the mean number of different groups per example of the step's batches.
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._pending: list[tuple[dict[str, float], list[str], torch.Tensor]] = []

    def add(
        self, terms: dict[str, torch.Tensor], scale: int, measures: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Count one micro-batch's loss ``terms`` and ``measures`` (values recorded, not optimised), each
        divided by ``scale``, the micro-batches of its step; returns its loss to back-propagate, the sum of
        the terms over ``scale``."""
        values = list(terms.values())
        loss = sum(values[1:], values[0]) / scale
        recorded = {**terms, **(measures or {})}
        for name, value in (("loss", loss), *((k, v / scale) for k, v in recorded.items())):
            value = value.detach().float()
            self._sums[name] = self._sums[name] + value if name in self._sums else value
        return loss

    def end_step(
        self, info: dict[str, float], grad_norm: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """Close an optimizer step: ``info`` (``step``, ``epoch``, ``lr``) and its sums, averaged over the
        processes by ``reduce``, wait for :meth:`flush`."""
        names = list(self._sums)
        values = reduce(torch.stack([self._sums[n] for n in names])) if names else grad_norm.new_zeros(0)
        self._pending.append((info, [*names, "grad_norm"], torch.cat([values, grad_norm.detach().float().reshape(1)])))
        self._sums = {}

    def flush(self, elapsed: float) -> list[dict[str, float | str]]:
        """The train records of the steps closed since the last flush (one transfer from the device)."""
        if not self._pending:
            return []
        flat = torch.cat([values for *_, values in self._pending]).tolist()
        records: list[dict[str, float | str]] = []
        at = 0
        for info, names, _ in self._pending:
            values = dict(zip(names, flat[at : at + len(names)]))
            at += len(names)
            records.append({"event": "train", **info, **values, "time": elapsed})
        self._pending = []
        return records
