"""How much of its accuracy a frozen backbone keeps on a group of τ of its features — the bound on what
SOP can learn over it, measured before training.

SOP predicts from groups: each group pass runs the frozen backbone on about τ of the input's features
(20 % by default).  A backbone that was never trained on such inputs may predict little from them (a
small ViT trained on one data set often drops to chance), and then no generator can make groups that
predict well.  :func:`diagnose` runs the backbone on the full inputs and on random groups of the
model's size in each mode, and says in plain words what that means for SOP and what to do.

    report = sopfast.diagnose(backbone, val_data, tau=0.2)
    print(report)           # the table and the verdict; report.to_dict() for files

A regression model (``SOP(task="regression")``, or ``task="regression"``) is measured in mean squared
error instead (:class:`sopfast.masking.regression_diagnosis.RegressionDiagnosis`): always predicting the
examples' mean target, the full input, and random groups.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm.auto import tqdm

from ..adapters import BackboneAdapter
from ..checks import check_bool, check_choice, check_class_ids, check_int, check_tau
from ..data.batches import parse_batch
from ..devices import module_device, resolve_device
from ..integrity import atomic_write_text
from ..model.sop import SOP, TASKS
from ..model.state_files import move_aside
from ..ops.counts import num_kept_table
from ..types import FeatureInputs
from .forward import adapter_of, run_mask_sets
from .own_groups import OwnGroups, own_group_scores
from .random_groups import random_groups
from .verdicts import ROBUST, check_finite, verdict

if TYPE_CHECKING:
    from .regression_diagnosis import RegressionDiagnosis

DIAGNOSIS_NAME = "diagnosis.json"
logger = logging.getLogger("sopfast.training")


@dataclass
class GroupAccuracy:
    """Accuracy on random groups in one mode: one group alone (the mean over groups), the ``m`` groups'
    probabilities averaged (what SOP must beat), and the best of the ``m`` (some group is right)."""

    one_group: float
    mean_of_groups: float
    best_of_groups: float


@dataclass
class Diagnosis:
    """What :func:`diagnose` measured (see the module docstring) and its verdict."""

    tau: float
    num_groups: int
    mode: str
    examples: int
    #: The share of the measured examples in their most common class (against labels, else against the
    #: backbone's predictions): the accuracy of always answering that class.
    chance: float
    full_accuracy: float
    random_groups: dict[str, GroupAccuracy]
    labels: str
    informed_group: float | None = None
    informed_examples: int = 0
    verdict: str = ""
    advice: list[str] = field(default_factory=list)
    own_groups: OwnGroups | None = None
    #: The share of the examples' features that the adapter finds blank (image backbones: all-background
    #: patches, which ``SOP(demote_blank=True)``, the default recipe, ranks last); ``None`` for other inputs
    #: and in records saved before 0.6.3.
    blank_share: float | None = None

    @property
    def to_beat(self) -> float:
        """The accuracy of groups that are not learned, in SOP's mode: the better of the ``m`` random groups
        averaged and the informed group.  Trained SOP groups should beat it; it is not SOP's ceiling (no
        cheap measurement gives that: the best group of 10 of 49 patches is a search over 8·10⁹ sets)."""
        averaged = self.random_groups[self.mode].mean_of_groups
        return averaged if self.informed_group is None else max(averaged, self.informed_group)

    def retained(self, mode: str | None = None) -> float:
        """One random group's accuracy above chance as a share of the full input's (1: nothing lost)."""
        above = self.full_accuracy - self.chance
        one = self.random_groups[mode or self.mode].one_group - self.chance
        return max(0.0, one / above) if above > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["retained"] = {mode: self.retained(mode) for mode in self.random_groups}
        out["to_beat"] = self.to_beat
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as JSON, all-or-nothing (:func:`sopfast.integrity.atomic_write_text`)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2))

    def lines(self) -> list[str]:
        """The table and the verdict, as lines of text."""
        truth = "labels" if self.labels == "labels" else "the backbone's own full-input predictions"
        out = [
            f"backbone diagnostic on {self.examples} examples (accuracy against {truth}; chance {self.chance:.3f}: "
            "the most common class's share):",
            f"  full input: {self.full_accuracy:.3f}",
        ]
        for mode, acc in self.random_groups.items():
            mark = " (SOP's mode)" if mode == self.mode else ""
            out.append(
                f"  random groups of tau={self.tau:g}, {mode}{mark}: one group {acc.one_group:.3f}, "
                f"{self.num_groups} averaged {acc.mean_of_groups:.3f}, best of {self.num_groups} "
                f"{acc.best_of_groups:.3f} (keeps {self.retained(mode):.0%} of the accuracy above chance)"
            )
        if self.informed_group is not None:
            out.append(
                f"  one informed group in {self.mode} (the tau={self.tau:g} features whose removal costs the backbone "
                f"most, occlusion, on {self.informed_examples} examples): {self.informed_group:.3f}"
            )
        out.append(f"  groups that are not learned reach {self.to_beat:.3f} in {self.mode}: SOP's should beat it")
        if self.own_groups is not None:
            out += self.own_groups.lines(self.mode)
        if self.blank_share:
            out.append(f"  blank features (all background): {self.blank_share:.0%} of the features")
        out.append(f"  verdict: {self.verdict}")
        out += [f"  - {line}" for line in self.advice]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


@overload
def diagnose(
    backbone: BackboneAdapter,
    data: Dataset | DataLoader | Iterable,
    *,
    tau: float | None = None,
    num_groups: int | None = None,
    mode: str | None = None,
    examples: int = 128,
    informed_examples: int = 32,
    batch_size: int = 32,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    task: Literal["classification"] | None = None,
    own_groups: bool | None = None,
) -> Diagnosis: ...


@overload
def diagnose(
    backbone: nn.Module,
    data: Dataset | DataLoader | Iterable,
    *,
    tau: float | None = None,
    num_groups: int | None = None,
    mode: str | None = None,
    examples: int = 128,
    informed_examples: int = 32,
    batch_size: int = 32,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    task: str | None = None,
    own_groups: bool | None = None,
) -> Diagnosis | RegressionDiagnosis: ...


def diagnose(
    backbone: nn.Module | BackboneAdapter | SOP,
    data: Dataset | DataLoader | Iterable,
    *,
    tau: float | None = None,
    num_groups: int | None = None,
    mode: str | None = None,
    examples: int = 128,
    informed_examples: int = 32,
    batch_size: int = 32,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    task: str | None = None,
    own_groups: bool | None = None,
) -> Diagnosis | RegressionDiagnosis:
    """Measure the frozen ``backbone`` on ``data``: on the full inputs, and on ``num_groups`` random
    groups of ``tau`` of the features per example in every mode the backbone supports; given a trained
    SOP, also the model itself with its own groups (``own_groups``).

    Args:
        backbone: an :class:`sopfast.SOP` (its backbone, ``tau``, ``num_groups`` and ``mode`` are the
            defaults), a backbone sopfast has an adapter for, or an adapter.
        data: labelled examples: a Dataset (``examples`` of them drawn at random with ``seed``), or a
            DataLoader or iterable of batches (its first ones), in any batch form :func:`sopfast.train`
            reads.  Labels are class ids of the backbone (an integer tensor ``[B]`` in ``[0, C)``;
            others are a ValueError/TypeError naming them); without labels, accuracy is measured
            against the backbone's full-input prediction.
        tau, num_groups: the group size and count (defaults: the SOP model's, else 0.2 and 20).
        mode: the mode SOP runs in, which the verdict is about (default: the model's, else ``drop``
            where the backbone supports it).
        examples: how many examples to measure (at most).
        informed_examples: on the first this many, also the informed group: the ``tau`` features whose
            removal lowers the backbone's predicted class most (occlusion, one pass per feature, in
            ``mode``); 0 skips it.
        batch_size: examples per backbone call when ``data`` is a Dataset.
        seed: draws the examples and the random groups.
        device: where to run (default: where the backbone is; given, the backbone or model is moved
            there, as :func:`sopfast.adapt_backbone` moves it); one this machine lacks is a ValueError.
        progress: show a progress bar.
        task: ``"classification"`` (accuracy) or ``"regression"`` (MSE, a ``RegressionDiagnosis``);
            default: the SOP model's task, else classification.
        own_groups: also measure the SOP model given as ``backbone`` with its own groups (its accuracy, its
            agreement with the backbone and where it loses: :class:`OwnGroups`); ``None``: when an SOP is given
            (classification only).

    ``chance`` is the share of the measured examples in their most common class.  For a regression
    :class:`sopfast.SOP` the report is a :class:`RegressionDiagnosis` (MSE against the targets ``[B, C]``,
    else against the backbone's full-input predictions; no informed group).  A backbone whose
    outputs are not finite is a ValueError naming its first non-finite parameter or buffer, else the
    output (non-finite inputs are refused by the adapter): accuracies over NaN logits mean nothing.
    """
    adapter = adapter_of(backbone)
    sop = backbone if isinstance(backbone, SOP) else None
    default_task = sop.task if sop is not None else "classification"
    chosen_task = check_choice("task", task if task is not None else default_task, TASKS)
    tau = check_tau(tau if tau is not None else (sop.tau if sop is not None else 0.2))
    num_groups = check_int(
        "num_groups", num_groups if num_groups is not None else (sop.num_groups if sop is not None else 20), 1
    )
    default_mode = str(sop.mode) if sop is not None else ("drop" if "drop" in adapter.supported_modes else "exact")
    chosen_mode: str = check_choice("mode", mode if mode is not None else default_mode, adapter.supported_modes)
    check_int("examples", examples, 1)
    check_int("informed_examples", informed_examples, 0)
    check_int("batch_size", batch_size, 1)
    check_int("seed", seed, 0)
    check_bool("progress", progress)
    check_bool("own_groups", own_groups, optional=True)
    if own_groups and sop is None:
        raise ValueError("own_groups=True measures an SOP model's own groups: pass the model, not a backbone")
    own = sop if own_groups is not False and chosen_task == "classification" else None
    run_device = resolve_device(device) if device is not None else module_device(adapter.backbone)
    if device is not None:
        (backbone if isinstance(backbone, nn.Module) else adapter.backbone).to(run_device)
    generator = torch.Generator().manual_seed(seed)
    if chosen_task == "regression":
        from .regression_diagnosis import diagnose_regression

        batches = _batches(data, examples, batch_size, generator)
        return diagnose_regression(
            adapter, batches, tau, num_groups, chosen_mode, examples, generator, run_device, progress
        )
    plan = _Plan(adapter, tau, num_groups, chosen_mode, examples, informed_examples, run_device, own)
    report = _measure(plan, _batches(data, examples, batch_size, generator), generator, progress)
    report.verdict, report.advice = verdict(report)
    return report


@dataclass
class _Plan:
    """What :func:`diagnose` measures: the backbone's ``adapter``, groups of ``tau`` (``num_groups`` per
    example) in every mode, the verdict's ``mode``, at most ``examples`` examples (the informed group on the
    first ``informed_examples``), on ``device``; ``own``: the SOP model measured with its own groups, or ``None``."""

    adapter: BackboneAdapter
    tau: float
    num_groups: int
    mode: str
    examples: int
    informed_examples: int
    device: torch.device
    own: SOP | None


def _measure(plan: _Plan, batches: Iterable[Any], generator: torch.Generator, progress: bool) -> Diagnosis:
    """The :class:`Diagnosis` of ``plan`` over ``batches`` (random groups drawn with ``generator``), without
    its verdict."""
    own_sums = torch.zeros(6, dtype=torch.float64)
    sums = {m: torch.zeros(3, dtype=torch.float64) for m in plan.adapter.supported_modes}
    full = seen = informed = informed_seen = blank_seen = 0
    blank = 0.0
    counts = torch.zeros(0, dtype=torch.long)  # examples per class of the truth measured against
    used_labels = True
    bar = tqdm(total=plan.examples, desc="sopfast diagnose", disable=not progress, leave=False)
    with torch.no_grad():
        for raw in batches:
            batch = parse_batch(raw).to(plan.device)
            n = min(len(batch), plan.examples - seen)
            inputs = plan.adapter.prepare(**cast(dict[str, Any], batch.adapter_inputs())).rows(slice(0, n))
            logits = plan.adapter.full_forward(inputs)[0].float()
            check_finite(logits, plan.adapter, "its output on the data")
            if batch.labels is None or batch.labels.dim() != 1:
                used_labels = False
                truth = logits.argmax(-1)
            else:
                truth = check_labels(batch.labels[:n], int(logits.shape[-1]))
            counts = _count(counts, truth)
            blank_features = plan.adapter.blank_features(inputs) if inputs.pixels is not None else None
            if blank_features is not None:
                blank += float(blank_features.float().mean(dim=1).sum())
                blank_seen += n
            full += int((logits.argmax(-1) == truth).sum())
            masks = random_groups(plan.adapter.candidate_mask(inputs), plan.tau, plan.num_groups, generator)
            for group_mode in plan.adapter.supported_modes:
                group_logits = run_mask_sets(plan.adapter, inputs, masks.to(plan.device), group_mode).logits.float()
                check_finite(group_logits, plan.adapter, f"its output on random groups in {group_mode} mode")
                sums[group_mode] += _group_scores(group_logits, truth).cpu()
            if plan.own is not None:
                own_sums += own_group_scores(plan.own, inputs, logits, truth, plan.mode)
            take = min(n, plan.informed_examples - informed_seen)
            if take > 0:
                rows = slice(0, take)
                group = informed_group(plan.adapter, inputs.rows(rows), logits[rows].argmax(-1), plan.tau, plan.mode)
                informed += int((group.argmax(-1) == truth[rows]).sum())
                informed_seen += take
            seen += n
            bar.update(n)
            if seen >= plan.examples:
                break
    bar.close()
    if seen == 0:
        raise ValueError("diagnose: data yielded no examples")
    return Diagnosis(
        tau=plan.tau,
        num_groups=plan.num_groups,
        mode=plan.mode,
        examples=seen,
        chance=int(counts.max()) / seen,
        full_accuracy=full / seen,
        random_groups={m: GroupAccuracy(*(s / seen).tolist()) for m, s in sums.items()},
        labels="labels" if used_labels else "backbone predictions",
        informed_group=informed / informed_seen if informed_seen else None,
        informed_examples=informed_seen,
        own_groups=None if plan.own is None else OwnGroups(*(own_sums / seen).tolist()),
        blank_share=blank / blank_seen if blank_seen else None,
    )


def diagnose_run(model: SOP, data: Any, config: Any, device: torch.device, write: Any) -> dict[str, Any]:
    """The diagnostic a training run starts with (``config``: its :class:`TrainConfig`): measured on
    ``data`` (read as training reads it: anything but a DataLoader is a dataset of examples, a list of
    ``(x, y)`` or of dicts included), saved as ``diagnosis.json`` in the run folder, passed to ``write``
    (the run's log) and logged in words (a weak verdict as a warning)."""
    if not isinstance(data, (DataLoader, Dataset)):
        data = Subset(data, range(len(data)))
    report = diagnose(
        model,
        data,
        examples=config.diagnose_examples,
        seed=config.seed,
        device=device,
        progress=config.progress,
        own_groups=False,  # the model is untrained
    )
    output_dir = config._output_path
    if output_dir is not None:
        report.save(output_dir / DIAGNOSIS_NAME)
    record = report.to_dict()
    write({"event": "diagnosis", "step": 0, **record})
    lines = report.lines()
    verdict_at = len(lines) - 1 - len(report.advice)
    for line in lines[:verdict_at]:
        logger.info(line)
    log = logger.info if report.retained() >= ROBUST else logger.warning
    log("backbone " + lines[verdict_at].strip())
    for line in report.advice:
        log(f"  - {line}")
    return record


def saved_diagnosis(output_dir: Path | None, records: Iterable[dict[str, Any]] = ()) -> dict[str, Any] | None:
    """The diagnosis a run folder saved, else the last ``diagnosis`` record of its log (``records``), else
    ``None``.  A damaged ``diagnosis.json`` is moved aside (``diagnosis.json.damaged-1``) with a warning."""
    path = None if output_dir is None else output_dir / DIAGNOSIS_NAME
    if path is not None and path.is_file():
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(report, dict):
                return report
            raise ValueError("it is not a JSON object")
        except ValueError as err:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            aside = move_aside(path)
            logger.warning("%s is damaged (%s): moved aside to %s", path, " ".join(str(err).split()), aside.name)
    logged = [r for r in records if r.get("event") == "diagnosis"]
    return {k: v for k, v in logged[-1].items() if k not in ("event", "step")} if logged else None


def informed_group(
    adapter: BackboneAdapter, inputs: FeatureInputs, target: torch.Tensor, tau: float, mode: str
) -> torch.Tensor:
    """Logits ``[B, C]`` of the backbone on one group per example: the ``num_kept(tau, ·)`` candidate
    features whose removal lowers the probability of ``target [B]`` most (occlusion in ``mode``)."""
    valid = adapter.candidate_mask(inputs)
    b, d = valid.shape
    eye = torch.eye(d, dtype=torch.bool, device=valid.device)
    without = valid.unsqueeze(1) & ~eye  # [B, d, d]: every feature removed in turn
    probs = run_mask_sets(adapter, inputs, without, mode, allow_empty=True).logits.float().softmax(-1)
    cost = -probs.gather(2, target.view(b, 1, 1).expand(b, d, 1)).squeeze(2)
    cost = cost.masked_fill(~valid, float("-inf"))
    k = torch.tensor(num_kept_table(float(tau), d), device=valid.device)[valid.sum(dim=1)]
    rank = cost.argsort(dim=-1, descending=True).argsort(dim=-1)
    group = (rank < k.view(b, 1)) & valid
    return run_mask_sets(adapter, inputs, group.unsqueeze(1), mode).logits[:, 0].float()


def check_labels(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """``labels [B]`` as class ids of a backbone with ``classes`` outputs: a TypeError naming the
    non-integer values (``0.5``; floats, even integral ones, are refused as :func:`sopfast.train`
    refuses them), a ValueError naming those outside ``[0, classes)`` (checked on the host on every device:
    the diagnostic reads its scores there anyway)."""
    if labels.is_floating_point() or labels.dtype == torch.bool:
        shown = sorted({float(v) for v in labels.flatten().tolist()})
        odd = [v for v in shown if not v.is_integer()] or shown
        raise TypeError(
            f"data: labels must be integer class ids in [0, {classes - 1}] (the backbone's {classes} classes), "
            f"got {labels.dtype} values {odd[:10]}"
        )
    check_class_ids("data: labels", labels.cpu(), classes, "classes of the backbone")  # on the host: an error
    return labels.long()


def _count(counts: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``counts`` (examples per class so far) plus the classes of ``truth [B]``."""
    found = torch.bincount(truth.cpu(), minlength=len(counts))
    return found + torch.nn.functional.pad(counts, (0, len(found) - len(counts)))


def _group_scores(logits: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-batch sums ``[3]``: correct single groups (averaged over the groups), correct averaged
    probabilities, examples with some correct group; ``logits [B, m, C]``, ``truth [B]``."""
    correct = logits.argmax(-1) == truth.view(-1, 1)
    averaged = logits.softmax(-1).mean(dim=1).argmax(-1) == truth
    return torch.stack([correct.double().mean(dim=1).sum(), averaged.double().sum(), correct.any(dim=1).double().sum()])


def _batches(data: Any, examples: int, batch_size: int, generator: torch.Generator) -> Iterable:
    """Batches of ``data``: a Dataset's ``examples`` drawn at random, else the iterable itself."""
    if isinstance(data, Dataset) and not isinstance(data, DataLoader) and hasattr(data, "__len__"):
        size = len(data)
        if size == 0:
            raise ValueError("diagnose: data is empty")
        picked = torch.randperm(size, generator=generator)[: min(size, examples)].tolist()
        return DataLoader(Subset(data, picked), batch_size=batch_size)
    if not isinstance(data, Iterable):
        raise TypeError(f"data must be a Dataset, a DataLoader or an iterable of batches, got {type(data).__name__}")
    return data
