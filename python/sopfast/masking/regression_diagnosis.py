"""The backbone diagnostic of a regression model (:func:`sopfast.diagnose` with ``task="regression"``): MSE
where the classification diagnostic measures accuracy — always predicting the measured examples' mean target
(the regression's chance), the full input, and random groups of τ of the features."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
from tqdm.auto import tqdm

from ..adapters import BackboneAdapter
from ..data.batches import parse_batch
from ..integrity import atomic_write_text
from .forward import run_mask_sets
from .random_groups import random_groups
from .verdicts import BLIND, ROBUST, check_finite


@dataclass
class GroupMSE:
    """MSE on random groups in one mode: one group alone (the mean over groups), the ``m`` groups'
    predictions averaged, and the best of the ``m`` per example."""

    one_group: float
    mean_of_groups: float
    best_of_groups: float


@dataclass
class RegressionDiagnosis:
    """:func:`sopfast.diagnose` of a regression model: MSE (over examples and outputs) of always predicting the
    measured examples' mean target (``mean_mse``, the regression's chance), of the full input and of
    random groups, and the verdict."""

    tau: float
    num_groups: int
    mode: str
    examples: int
    mean_mse: float
    full_mse: float
    random_groups: dict[str, GroupMSE]
    labels: str
    verdict: str = ""
    advice: list[str] = field(default_factory=list)

    def retained(self, mode: str | None = None) -> float:
        """The share of the full input's MSE reduction (from ``mean_mse``) that one random group keeps."""
        gain = self.mean_mse - self.full_mse
        one = self.mean_mse - self.random_groups[mode or self.mode].one_group
        return max(0.0, one / gain) if gain > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["retained"] = {mode: self.retained(mode) for mode in self.random_groups}
        return out

    def lines(self) -> list[str]:
        """The table and the verdict, as lines of text."""
        truth = "targets" if self.labels == "labels" else "the backbone's own full-input predictions"
        out = [
            f"backbone diagnostic on {self.examples} examples (MSE against {truth}; always predicting their mean: "
            f"{self.mean_mse:.4f}):",
            f"  full input: {self.full_mse:.4f}",
        ]
        for mode, g in self.random_groups.items():
            mark = " (SOP's mode)" if mode == self.mode else ""
            out.append(
                f"  random groups of tau={self.tau:g}, {mode}{mark}: one group {g.one_group:.4f}, {self.num_groups} "
                f"averaged {g.mean_of_groups:.4f}, best of {self.num_groups} {g.best_of_groups:.4f} (keeps "
                f"{self.retained(mode):.0%} of the full input's MSE reduction)"
            )
        out.append(f"  verdict: {self.verdict}")
        return out + [f"  - {line}" for line in self.advice]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as JSON, all-or-nothing (:func:`sopfast.integrity.atomic_write_text`)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2))


def diagnose_regression(
    adapter: BackboneAdapter,
    batches: Iterable,
    tau: float,
    num_groups: int,
    mode: str,
    examples: int,
    generator: torch.Generator,
    device: torch.device,
    progress: bool,
) -> RegressionDiagnosis:
    """:func:`sopfast.diagnose` for a regression model on ``batches`` (its first ``examples``), with ``num_groups``
    random groups of ``tau`` per example drawn with ``generator``; ``mode`` is the one the verdict is about."""
    truths, fulls = [], []
    groups: dict[str, list[torch.Tensor]] = {m: [] for m in adapter.supported_modes}
    seen, used_labels = 0, True
    with torch.no_grad(), tqdm(total=examples, desc="sopfast diagnose", disable=not progress, leave=False) as bar:
        for raw in batches:
            batch = parse_batch(raw).to(device)
            n = min(len(batch), examples - seen)
            inputs = adapter.prepare(**cast(dict[str, Any], batch.adapter_inputs())).rows(slice(0, n))
            full = adapter.full_forward(inputs)[0].float()
            check_finite(full, adapter, "its output on the data")
            if batch.labels is None:
                used_labels, truth = False, full
            else:
                truth = check_targets(batch.labels[:n], int(full.shape[-1]))
            masks = random_groups(adapter.candidate_mask(inputs), tau, num_groups, generator).to(device)
            for group_mode in adapter.supported_modes:
                logits = run_mask_sets(adapter, inputs, masks, group_mode).logits.float()
                check_finite(logits, adapter, f"its output on random groups in {group_mode} mode")
                groups[group_mode].append(logits.cpu())
            truths.append(truth.cpu())
            fulls.append(full.cpu())
            seen += n
            bar.update(n)
            if seen >= examples:
                break
    if seen == 0:
        raise ValueError("diagnose: data yielded no examples")
    truth = torch.cat(truths)
    report = RegressionDiagnosis(
        tau=tau,
        num_groups=num_groups,
        mode=mode,
        examples=seen,
        mean_mse=float((truth - truth.mean(0)).pow(2).mean()),
        full_mse=float((torch.cat(fulls) - truth).pow(2).mean()),
        random_groups={m: _group_mse(torch.cat(g), truth) for m, g in groups.items()},
        labels="labels" if used_labels else "backbone predictions",
    )
    report.verdict, report.advice = regression_verdict(report)
    return report


def _group_mse(logits: torch.Tensor, truth: torch.Tensor) -> GroupMSE:
    """``logits [N, m, C]`` of the random groups against ``truth [N, C]``."""
    per_group = (logits - truth.unsqueeze(1)).pow(2).mean(-1)  # [N, m]
    averaged = (logits.mean(1) - truth).pow(2).mean(-1)
    return GroupMSE(float(per_group.mean()), float(averaged.mean()), float(per_group.min(1).values.mean()))


def check_targets(targets: torch.Tensor, outputs: int) -> torch.Tensor:
    """Regression ``targets`` ``[B, outputs]`` (or ``[B]`` for one output) as floats; a ValueError naming the
    shape otherwise."""
    if targets.dim() == 1 and outputs == 1:
        targets = targets.unsqueeze(1)
    if targets.dim() != 2 or targets.shape[1] != outputs or targets.dtype == torch.bool or targets.is_complex():
        raise ValueError(
            f"data: regression targets must be real numbers of shape [B, {outputs}] (the backbone's outputs), got "
            f"{targets.dtype} of shape {tuple(targets.shape)}"
        )
    return targets.float()


def regression_verdict(report: RegressionDiagnosis) -> tuple[str, list[str]]:
    """The plain-words verdict on a :class:`RegressionDiagnosis` and what to do about it."""
    share, kept = f"{report.tau:.0%}", report.retained()
    if report.full_mse >= 0.95 * report.mean_mse:
        text = (
            f"no better than the mean: the backbone's MSE on whole inputs is {report.full_mse:.4f}, always predicting "
            f"the mean gives {report.mean_mse:.4f}, and SOP cannot be more accurate than its backbone"
        )
        return text, ["check that the backbone was trained for these targets (their order and scale)"]
    if kept >= ROBUST:
        return (
            f"robust: one random group of {share} of the features keeps {kept:.0%} of the full input's MSE reduction "
            f"in {report.mode} mode, so SOP has room to learn groups better than random ones"
        ), []
    word = "fragile" if kept >= BLIND else "blind"
    return (
        f"{word}: one random group of {share} of the features keeps {kept:.0%} of the full input's MSE reduction in "
        f"{report.mode} mode; SOP's groups will cost accuracy"
    ), ["give the groups more of the features (a larger tau, e.g. --tau 0.4)"]
