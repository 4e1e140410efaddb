"""``sopfast.evaluate``: the paper's evaluation, batched on SOP's own group-execution path.

The generator's embedding runs once per batch; every sparsity, every insertion/deletion step
and every group count then re-binarises the same attention logits and runs the frozen
backbone on all groups of the batch at once (``exact`` or ``drop``), exactly as
``model(x, tau=...)`` would.  Baselines (:mod:`sopfast.baselines`) go through the same
masked path and get the same metrics.

Accepted batches (``loader`` yields any form :func:`sopfast.data.batches.parse_batch` accepts):

* images, tuples/lists: ``(x,)``, ``(x, y)`` or ``(x, y, gt_mask)``; or a bare tensor ``x``;
* images, dicts: ``{"pixel_values" | "x" | "images": x, "labels" | "label" | "y": y, <gt>}``;
* text, dicts: ``{"input_ids", "attention_mask", "token_type_ids"?, "labels"?, <gt>}``.

``x [B, C, H, W]``; ``y [B]`` class ids (classification) or ``[B, C]`` / ``[B]`` targets
(regression); ``gt_mask`` the ground truth for IoU-type metrics: ``[B, d]`` at feature level
(patches / tokens / CNN cells), ``[B, h, w]`` on the feature grid, or ``[B, H, W]`` pixels (a
feature counts as object when at least half its pixels are).  ``<gt>`` is the key
``ground_truth_key`` (for dicts; default the first of ``"evidence_mask"``, ``"gt_mask"``,
``"ground_truth"`` present) or the tuple position ``ground_truth_key`` (default 2).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..adapters.base import check_mode
from ..checks import check_bool, check_class_ids, check_number
from ..data.batches import FORMATS, parse_batch
from ..devices import module_device, resolve_device
from ..types import FeatureInputs
from . import metrics as M
from .baselines import available_baselines, make_baseline
from .methods import Method, SOPMethod
from .registry import REGISTRY, Plan, Step, feature_ground_truth, metric_names
from .tables import Results, format_table

if TYPE_CHECKING:
    from ..model.sop import SOP

TAUS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
GROUP_COUNTS = (1, 2, 5, 10, 20)
# the paper's accuracy curves: inference sparsities × group counts
CURVE_TAUS = (0.05, 0.1, 0.2, 0.4)
CURVE_COUNTS = (1, 3, 5, 20)


# -- batches --------------------------------------------------------------------------------
@dataclass
class _Prepared:
    """One loader item, parsed by :func:`sopfast.data.batches.parse_batch` and moved to the device:
    the model's prepared ``inputs``, ``labels`` and ``ground_truth`` (or ``None``)."""

    inputs: FeatureInputs
    labels: torch.Tensor | None
    ground_truth: torch.Tensor | None


def _prepare_batch(model: SOP, raw: Any, ground_truth_key: str | int | None, device: torch.device) -> _Prepared:
    """Parse a loader item (forms: :mod:`sopfast.data.batches`) and wrap its input for ``model`` on ``device``."""
    batch = parse_batch(raw, ground_truth_key).to(device)
    return _Prepared(model.prepare(**batch.model_inputs()), batch.labels, batch.ground_truth)


# -- argument checks ------------------------------------------------------------------------
def check_metrics(metrics: Iterable[str] | str | None, task: str, has_ground_truth_key: bool = False) -> list[str]:
    """Validate metric names for ``task``; ``None`` gives the task's defaults."""
    if metrics is None:
        metrics = [name for name, m in REGISTRY.items() if m.default and task in m.tasks]
        metrics += ["iou", "coverage", "grounding"] if has_ground_truth_key else []
    if isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    allowed = metric_names()
    if not metrics:
        raise ValueError(f"metrics must name at least one metric; allowed: {allowed}")
    for name in metrics:
        if name not in REGISTRY:
            raise ValueError(f"unknown metric {name!r}; allowed: {allowed}")
        if task not in REGISTRY[name].tasks:
            needed = " or ".join(REGISTRY[name].tasks)
            hint = "; use 'accuracy' or 'error' for classification" if name == "mse" else ""
            raise ValueError(f"metric {name!r} needs a {needed} model; this model's task is {task!r}{hint}")
    return list(dict.fromkeys(metrics))


def check_taus(taus: Iterable[float], name: str = "taus") -> list[float]:
    """Validate a list of sparsities, each in ``(0, 1]``."""
    values = [taus] if isinstance(taus, numbers.Real) else list(taus)
    if not values:
        raise ValueError(f"{name} must hold at least one value in (0, 1]")
    for t in values:
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0.0 < float(t) <= 1.0:
            raise ValueError(f"{name} must hold values in (0, 1], got {t!r} in {values}")
    return [float(t) for t in values]


def step_taus(step: float) -> list[float]:
    """Insertion/deletion sparsities ``step, 2·step, …, 1.0`` (``1/step`` must be a whole number)."""
    if isinstance(step, bool) or not isinstance(step, numbers.Real) or not 0.0 < float(step) <= 1.0:
        raise ValueError(f"step must lie in (0, 1], got {step!r}")
    n = round(1.0 / step)
    if abs(n * step - 1.0) > 1e-6:
        raise ValueError(f"step must divide 1 into whole steps (0.1, 0.2, 0.25, …), got {step}")
    return [round((i + 1) / n, 10) for i in range(n)]


def check_group_counts(counts: Iterable[int], name: str = "group_counts") -> list[int]:
    """Validate group counts (positive integers)."""
    values: list[int] = [counts] if isinstance(counts, int) else list(counts)
    if not values or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in values):
        raise ValueError(f"{name} must be positive integers, got {values!r}")
    return values


def _check_counts_fit(counts: list[int], name: str, num_groups: int) -> None:
    """Group counts a caller gave are at most the model's ``num_groups`` (``m``): the ablations run SOP with
    fewer groups than it was trained with, never more."""
    above = [c for c in counts if c > num_groups]
    if above:
        raise ValueError(f"{name} must be at most the model's num_groups m={num_groups}, got {above}")


def _resolve_baselines(baselines: Iterable[str | Method] | str | None) -> list[Method]:
    if baselines is None:
        return []
    if isinstance(baselines, str):
        baselines = available_baselines() if baselines == "all" else [baselines]
    methods = []
    for b in baselines:
        if isinstance(b, Method):
            methods.append(b)
        elif b == "all":
            methods.extend(make_baseline(n) for n in available_baselines())
        else:
            methods.append(make_baseline(b))
    names = [m.name for m in methods] + [SOPMethod.name]
    if len(set(names)) != len(names):
        raise ValueError(f"baseline names must be unique and differ from 'SOP', got {names[:-1]}")
    return methods


def _check_batch(batch: _Prepared, plan: Plan, model: SOP, given_counts: list[int]) -> None:
    """Labels and ground truth present where the metrics need them, class ids in range, and the group counts
    given (``given_counts``; the defaults run as SOP runs them, repeating query rows) at most the features."""
    metrics, task = plan.metrics, model.task
    missing = [m for m in metrics if task in REGISTRY[m].needs_labels]
    if missing and batch.labels is None:
        raise ValueError(f"metrics {missing} need labels, but the batch has none ({FORMATS})")
    if task == "classification" and batch.labels is not None:
        check_class_ids("labels", batch.labels, model.num_classes, "classes of the model")
    d = model.adapter.num_features(batch.inputs)
    if "num_groups" in metrics and max(given_counts, default=0) > d:
        raise ValueError(
            f"group_counts must be at most the {d} features of the inputs, got {[c for c in given_counts if c > d]}"
        )
    missing = [m for m in metrics if REGISTRY[m].needs_ground_truth]
    if missing and batch.ground_truth is None:
        raise ValueError(
            f"metrics {missing} need ground-truth masks: yield (x, y, gt_mask) or dicts with the mask under "
            "ground_truth_key (default 'evidence_mask' / 'gt_mask' / 'ground_truth')"
        )


# -- the runner -----------------------------------------------------------------------------
class _Kept:
    """One method's kept per-example values, by key, over batches."""

    def __init__(self) -> None:
        self.values: dict[str, list[torch.Tensor]] = {}

    def add(self, values: dict[str, torch.Tensor]) -> None:
        for key, value in values.items():
            self.values.setdefault(key, []).append(value.detach().cpu())

    def concatenated(self) -> dict[str, torch.Tensor]:
        """Each key's values in one tensor; a last dimension that differs between batches (text
        lengths) is zero-padded."""
        out = {}
        for key, parts in self.values.items():
            width = max(p.shape[-1] for p in parts) if parts[0].dim() > 1 else None
            out[key] = torch.cat([F.pad(p, (0, width - p.shape[-1])) if width else p for p in parts])
        return out


def _run_method(method: Method, model: SOP, batch: _Prepared, gt: torch.Tensor | None, plan: Plan, kept: _Kept) -> None:
    step = Step(method, model, batch.inputs, batch.labels, gt, plan, method.prepare(model, batch.inputs, plan.mode))
    kept.add({"count": torch.tensor([batch.inputs.batch_size])})
    for name in plan.metrics:
        metric = REGISTRY[name]
        if not metric.sop_only or isinstance(method, SOPMethod):
            kept.add(metric.collect(step))


def _finalize(kept: _Kept, plan: Plan, model: SOP) -> dict[str, Any]:
    values = kept.concatenated()
    out: dict[str, Any] = {"examples": int(values["count"].sum())}
    for name in plan.metrics:
        out.update(REGISTRY[name].finalize(values, plan, model))
    return out


def evaluate(
    model: SOP,
    loader: Iterable,
    metrics: Iterable[str] | None = None,
    mode: Literal["exact", "drop"] | None = None,
    ground_truth_key: str | int | None = None,
    baselines: Iterable[str | Method] | str | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    *,
    taus: Iterable[float] = TAUS,
    step: float = 0.1,
    group_counts: Iterable[int] = GROUP_COUNTS,
    tau_v: float = 0.6,
    tau_c: float = 0.015,
    curve_taus: Iterable[float] = CURVE_TAUS,
    curve_counts: Iterable[int] = CURVE_COUNTS,
    backbone_row: bool = True,
    print_table: bool = False,
) -> Results:
    """Evaluate ``model`` (and ``baselines``) on every batch of ``loader``; returns ``{method: {metric: value}}``.

    Args:
        model: a :class:`sopfast.SOP` (put in eval mode for the run, restored after).
        loader: batches in a format of this module's docstring.
        metrics: names of registered metrics (:func:`~sopfast.evaluation.registry.metric_names`);
            ``None``: accuracy (MSE for regression), fidelity, insertion, deletion, sparsity (+ iou,
            coverage when ``ground_truth_key`` is given).
        mode: ``"exact"`` / ``"drop"`` group execution (default: the model's).
        ground_truth_key: where batches keep the ground-truth mask (dict key or tuple position).
        baselines: names (:func:`sopfast.baselines.available_baselines`), :class:`Method`
            instances, or ``"all"``; each gets the same metrics (``num_groups`` is SOP-only).
        device: run there (the model is moved); default the model's device.
        progress: show a tqdm bar.
        taus: sparsities of the ``sparsity`` curve.  step: insertion/deletion step (10 %).
        group_counts: group counts of the ``num_groups`` ablation (given: at most the model's ``num_groups``).
        tau_v: the CosmoGrid void threshold of ``purity``.
        tau_c: the CosmoGrid cluster threshold of ``purity``.
        curve_taus: inference sparsities of the ``curves`` metric (the paper's accuracy curves).
        curve_counts: group counts of the ``curves`` metric (methods with one group vary τ only; given: at
            most the model's ``num_groups``).
        backbone_row: add a row ``"Backbone"``: the frozen backbone alone on the full input
            (accuracy, or MSE for regression), what SOP's accuracy costs.
        print_table: also print :func:`format_table` of the results.

    Per method: ``examples``; ``accuracy`` / ``error`` / ``mse``; ``fidelity`` (mean KL);
    ``insertion`` / ``deletion`` (AUC as a fraction of the full-input score; raw MSE AUC for
    regression) with ``*_auc`` and ``*_curve`` ``{τ: mean score}``; ``sparsity`` ``{τ: score}``;
    ``num_groups`` ``{m: score}``; ``iou``, ``coverage``, ``purity`` (means over examples with a
    defined value); ``object_ratio`` ``{correct, incorrect, num_correct, num_incorrect}``;
    ``leakage`` ``{accuracy, chance, num_train, num_test}``; ``diversity`` adds
    ``distinct_groups``, ``pairwise_iou``, ``union_coverage`` (over all ``m`` groups),
    ``groups_used`` and ``distinct_used_groups`` (groups the prediction uses), means over
    examples (:func:`sopfast.metrics.group_diversity`); ``curves`` ``{"τ/m": score}`` (``{"τ": score}``
    for one-group methods); ``grounding`` adds ``on_object`` / ``on_object_used`` (share of the
    features of all / the used groups on the object) and ``object_iou``.
    """
    from ..model.sop import SOP

    if not isinstance(model, SOP):
        raise TypeError(
            f"model must be a sopfast.SOP, got {type(model).__name__}; wrap a backbone first: sopfast.SOP(backbone)"
        )
    if not isinstance(loader, Iterable) or isinstance(loader, (str, bytes, torch.Tensor)):
        raise TypeError(f"loader must be an iterable of batches (a DataLoader), got {type(loader).__name__}")
    metrics = check_metrics(metrics, model.task, ground_truth_key is not None)
    if "purity" in metrics and model.adapter.modality != "image":
        raise ValueError("metric 'purity' (CosmoGrid void/cluster purity) needs an image model")
    plan = Plan(
        metrics,
        check_mode(model.adapter, model.mode if mode is None else mode),
        check_taus(taus),
        step_taus(step),
        check_group_counts(group_counts),
        check_number("tau_v", tau_v),
        check_number("tau_c", tau_c),
        check_taus(curve_taus, "curve_taus"),
        check_group_counts(curve_counts, "curve_counts"),
    )
    if group_counts is not GROUP_COUNTS:
        _check_counts_fit(plan.group_counts, "group_counts", model.num_groups)
    if curve_counts is not CURVE_COUNTS:
        _check_counts_fit(plan.curve_counts, "curve_counts", model.num_groups)
    check_bool("progress", progress)
    check_bool("backbone_row", backbone_row)
    check_bool("print_table", print_table)
    if isinstance(ground_truth_key, bool) or not isinstance(ground_truth_key, (str, int, type(None))):
        raise ValueError(
            f"ground_truth_key must be a dict key (str), a tuple position (int) or None, got {ground_truth_key!r}"
        )
    methods: list[Method] = [SOPMethod(), *_resolve_baselines(baselines)]
    if device is None:
        device = module_device(model)
    else:
        device = resolve_device(device)
        model.to(device)
    kept = {m.name: _Kept() for m in methods}
    backbone = _Kept() if backbone_row and any(REGISTRY[m].needs_labels for m in plan.metrics) else None
    was_training = model.training
    model.eval()
    try:
        given_counts = [] if group_counts is GROUP_COUNTS else plan.group_counts
        _run(model, loader, methods, kept, plan, ground_truth_key, device, progress, backbone, given_counts)
    finally:
        model.train(was_training)
    results = {name: _finalize(values, plan, model) for name, values in kept.items()}
    if backbone is not None and "score" in backbone.values:
        values = backbone.concatenated()
        score = "mse" if model.task == "regression" else "accuracy"
        results["Backbone"] = {"examples": int(values["count"].sum()), score: float(values["score"].mean())}
        if "agreement" in plan.metrics:  # the backbone agrees with itself
            results["Backbone"].update(agreement=1.0, agreement_kl=0.0)
    if print_table:
        print(format_table(results))
    return results


def _run(
    model, loader, methods, kept, plan: Plan, ground_truth_key, device, progress: bool, backbone, given_counts
) -> None:
    """Every method on every batch; the progress bar counts methods × batches and names the method."""
    total = len(loader) * len(methods) if hasattr(loader, "__len__") else None
    needs_ground_truth = any(REGISTRY[m].needs_ground_truth for m in plan.metrics)
    batches = 0
    with torch.no_grad(), tqdm(total=total, desc="sopfast evaluate", disable=not progress) as bar:
        for raw in loader:
            batch = _prepare_batch(model, raw, ground_truth_key, device)
            _check_batch(batch, plan, model, given_counts)
            gt = None
            if needs_ground_truth and batch.ground_truth is not None:
                gt = feature_ground_truth(model, batch.inputs, batch.ground_truth)
            if backbone is not None and batch.labels is not None:
                logits = model.reference_logits(batch.inputs)
                score = M.mse if model.task == "regression" else M.accuracy
                backbone.add(
                    {
                        "count": torch.tensor([batch.inputs.batch_size]),
                        "score": score(logits, batch.labels, reduction="none"),
                    }
                )
            for method in methods:
                bar.set_postfix_str(method.name)
                _run_method(method, model, batch, gt, plan, kept[method.name])
                bar.update(1)
            batches += 1
    if batches == 0:
        raise ValueError("loader yielded no batches; evaluate needs at least one example")


__all__ = [
    "GROUP_COUNTS",
    "TAUS",
    "check_group_counts",
    "check_metrics",
    "check_taus",
    "evaluate",
    "feature_ground_truth",
    "format_table",
    "metric_names",
    "step_taus",
]
