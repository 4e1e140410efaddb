"""``sopfast.evaluate``: the paper's evaluation, batched on SOP's own group-execution path.

The generator's embedding runs once per batch; every sparsity, every insertion/deletion step
and every group count then re-binarises the same attention logits and runs the frozen
backbone on all groups of the batch at once (``exact`` or ``drop``), exactly as
``model(x, tau=...)`` would.  Baselines (:mod:`sopfast.baselines`) go through the same
masked path and get the same metrics.

Accepted batches (``loader`` yields any form :func:`sopfast.batches.parse_batch` accepts):

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

import argparse
import json
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..adapters.base import check_mode
from ..adapters.images import upsample_mask
from ..checks import check_bool, check_number, finite_float
from ..data.batches import FORMATS, parse_batch
from ..devices import resolve_device
from ..types import FeatureInputs, Groups
from . import metrics as M
from .baselines import Method, Prediction, available_baselines, candidate_mask, make_baseline

if TYPE_CHECKING:
    from ..model.sop import SOP

TAUS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
GROUP_COUNTS = (1, 2, 5, 10, 20)
METRICS = (
    "accuracy",
    "error",
    "mse",
    "fidelity",
    "insertion",
    "deletion",
    "sparsity",
    "iou",
    "coverage",
    "object_ratio",
    "purity",
    "leakage",
    "num_groups",
    "diversity",
)
NEEDS_GROUND_TRUTH = frozenset({"iou", "coverage", "object_ratio"})
NEEDS_LABELS = frozenset({"accuracy", "error", "mse", "sparsity", "num_groups", "leakage", "object_ratio"})
CLASSIFICATION_ONLY = frozenset({"accuracy", "error", "object_ratio", "leakage"})
REGRESSION_ONLY = frozenset({"mse"})
Results = dict[str, dict[str, Any]]


# -- SOP as a method ------------------------------------------------------------------------
@dataclass
class _SOPState:
    emb: torch.Tensor
    valid: torch.Tensor
    grid: tuple[int, int] | None
    logits: dict[int, torch.Tensor] = field(default_factory=dict)


class SOPMethod(Method[_SOPState]):
    """The SOP model itself: the generator embedding runs once per batch (:meth:`prepare`), and
    groups at any τ / group count come from the same attention logits (:meth:`groups`)."""

    name = "SOP"

    def prepare(self, model: SOP, inputs: FeatureInputs, mode: str) -> _SOPState:
        with torch.no_grad():
            emb = model.adapter.embed(model.projection, inputs)
        return _SOPState(emb, candidate_mask(model, inputs), model.adapter.feature_grid(inputs))

    def groups(self, model: SOP, state: _SOPState, tau: float, largest: bool, num_groups: int | None = None) -> Groups:
        """What ``model.make_groups`` returns for this τ (eval mode; ``largest=False`` = ``deletion=True``)."""
        m = model.num_groups if num_groups is None else num_groups
        if m not in state.logits:
            with torch.no_grad(), torch.autocast(device_type=state.emb.device.type, enabled=False):
                state.logits[m] = model.generator.logits(state.emb, state.valid, m, None)
        return model.generator.binarise(state.logits[m], state.valid, tau, deletion=not largest, grid=state.grid)

    def predict(
        self,
        model: SOP,
        inputs: FeatureInputs,
        state: _SOPState,
        tau: float | None,
        largest: bool | None,
        mode: str,
        num_groups: int | None = None,
    ) -> Prediction:
        tau = model.tau if tau is None else tau
        largest = (not model.deletion) if largest is None else largest
        out = model.predict_groups(inputs, self.groups(model, state, tau, largest, num_groups), mode)
        return Prediction(out.logits.float(), out.attributions.float(), out.group_masks, out.group_scores > 0)


# -- batches --------------------------------------------------------------------------------
@dataclass
class _Prepared:
    """One loader item, parsed by :func:`sopfast.batches.parse_batch` and moved to the device:
    the model's prepared ``inputs``, ``labels`` and ``ground_truth`` (or ``None``)."""

    inputs: FeatureInputs
    labels: torch.Tensor | None
    ground_truth: torch.Tensor | None


def _prepare_batch(model: SOP, raw: Any, ground_truth_key: str | int | None, device: torch.device) -> _Prepared:
    """Parse a loader item (forms: :mod:`sopfast.batches`) and wrap its input for ``model`` on ``device``."""
    batch = parse_batch(raw, ground_truth_key).to(device)
    return _Prepared(model.prepare(**batch.model_inputs()), batch.labels, batch.ground_truth)


def feature_ground_truth(model: SOP, inputs: FeatureInputs, gt: torch.Tensor) -> torch.Tensor:
    """Ground truth at feature level ``[B, d]`` bool from ``[B, d]``, ``[B, h, w]`` (grid) or ``[B, H, W]`` (pixels)."""
    b, d = inputs.batch_size, model.adapter.num_features(inputs)
    grid = model.adapter.feature_grid(inputs)
    if gt.dim() == 4 and gt.shape[1] == 1:
        gt = gt[:, 0]
    if gt.shape[:1] == (b,) and gt.dim() == 2 and gt.shape[1] == d:
        return gt.bool()
    if gt.shape[:1] == (b,) and gt.dim() == 3 and grid is not None:
        if tuple(gt.shape[1:]) == tuple(grid):
            return gt.flatten(1).bool()
        if inputs.pixels is not None and gt.shape[1:] == inputs.pixels.shape[-2:]:
            return (F.adaptive_avg_pool2d(gt.float().unsqueeze(1), grid) >= 0.5).flatten(1)
    allowed = f"[B, d] = [{b}, {d}]"
    if grid is not None:
        allowed += f", [B, {grid[0]}, {grid[1]}] (feature grid) or [B, H, W] (pixels)"
    raise ValueError(f"ground-truth mask must have shape {allowed}; got {tuple(gt.shape)}")


# -- argument checks ------------------------------------------------------------------------
def check_metrics(metrics: Iterable[str] | str | None, task: str, has_ground_truth_key: bool = False) -> list[str]:
    """Validate metric names for ``task``; ``None`` gives the task's defaults."""
    if metrics is None:
        metrics = ["accuracy" if task == "classification" else "mse", "fidelity", "insertion", "deletion", "sparsity"]
        metrics += ["iou", "coverage"] if has_ground_truth_key else []
    if isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    if not metrics:
        raise ValueError(f"metrics must name at least one metric; allowed: {METRICS}")
    for name in metrics:
        if name not in METRICS:
            raise ValueError(f"unknown metric {name!r}; allowed: {METRICS}")
        if task == "regression" and name in CLASSIFICATION_ONLY:
            raise ValueError(f"metric {name!r} needs a classification model; this model's task is 'regression'")
        if task != "regression" and name in REGRESSION_ONLY:
            raise ValueError(f"metric {name!r} needs a regression model; use 'accuracy' or 'error' for classification")
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


def check_group_counts(counts: Iterable[int]) -> list[int]:
    """Validate the group counts of the number-of-groups ablation (positive integers)."""
    values: list[int] = [counts] if isinstance(counts, int) else list(counts)
    if not values or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in values):
        raise ValueError(f"group_counts must be positive integers, got {values!r}")
    return values


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


def _check_batch(batch: _Prepared, metrics: list[str], task: str) -> None:
    need_labels = NEEDS_LABELS | ({"insertion", "deletion"} if task == "regression" else set())
    missing = [m for m in metrics if m in need_labels]
    if missing and batch.labels is None:
        raise ValueError(f"metrics {missing} need labels, but the batch has none ({FORMATS})")
    missing = [m for m in metrics if m in NEEDS_GROUND_TRUTH]
    if missing and batch.ground_truth is None:
        raise ValueError(
            f"metrics {missing} need ground-truth masks: yield (x, y, gt_mask) or dicts with the mask under "
            "ground_truth_key (default 'evidence_mask' / 'gt_mask' / 'ground_truth')"
        )


# -- the runner -----------------------------------------------------------------------------
@dataclass
class _Plan:
    metrics: list[str]
    mode: str
    taus: list[float]
    steps: list[float]
    group_counts: list[int]
    tau_v: float
    tau_c: float


class _Accumulator:
    """Per-example values of one method, concatenated over batches."""

    def __init__(self) -> None:
        self.values: dict[str, list[torch.Tensor]] = {}

    def add(self, key: str, value: torch.Tensor) -> None:
        self.values.setdefault(key, []).append(value.detach().cpu())

    def cat(self, key: str) -> torch.Tensor:
        return torch.cat(self.values[key])

    def cat_padded(self, key: str) -> torch.Tensor:
        """Concatenate ``[B, ..., d_batch]`` tensors, padding the last dim (text lengths differ) with zeros."""
        d = max(v.shape[-1] for v in self.values[key])
        return torch.cat([F.pad(v, (0, d - v.shape[-1])) for v in self.values[key]])


def _scores(logits: torch.Tensor, labels: torch.Tensor, task: str) -> torch.Tensor:
    """Per-example accuracy (0/1) or MSE of ``logits [B, C]``."""
    if task == "regression":
        return M.mse(logits, labels, reduction="none")
    return M.accuracy(logits, labels, reduction="none")


def _used_for_prediction(pred: Prediction, task: str) -> torch.Tensor:
    """``[B, m]``: the groups used for the predicted class (any output, for regression)."""
    if task == "regression":
        return pred.used.any(dim=1)
    top = pred.logits.argmax(dim=-1).view(-1, 1, 1).expand(-1, 1, pred.used.shape[-1])
    return pred.used.gather(1, top).squeeze(1)


def _present(value: torch.Tensor | None, what: str) -> torch.Tensor:
    """``value``, known to be there: :func:`_check_batch` has already refused batches that lack it."""
    if value is None:
        raise ValueError(f"the batch has no {what} ({FORMATS})")
    return value


def _steps(
    method: Method, model: SOP, batch: _Prepared, state: Any, taus: list[float], largest: bool, mode: str
) -> torch.Tensor:
    """``[B, steps, C]`` logits at each sparsity of ``taus``."""
    return torch.stack([method.predict(model, batch.inputs, state, t, largest, mode).logits for t in taus], dim=1)


def _curve(step_logits: torch.Tensor, labels: torch.Tensor | None, task: str, deletion: bool) -> torch.Tensor:
    if task == "regression":
        return M.mse_curve(step_logits, _present(labels, "labels"))
    return M.probability_curve(step_logits, penalize_switch=deletion)


def _pixel_groups(model: SOP, inputs: FeatureInputs, masks: torch.Tensor) -> torch.Tensor:
    b, m, _ = masks.shape
    grid = model.adapter.feature_grid(inputs)
    if grid is None:
        raise ValueError(f"pixel-level metrics need a feature grid; {type(model.adapter).__name__} has none")
    pixels = inputs.require_pixels()
    size = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    return upsample_mask(masks.reshape(b * m, *grid), size).reshape(b, m, -1)


def _run_method(
    method: Method, model: SOP, batch: _Prepared, gt: torch.Tensor | None, plan: _Plan, acc: _Accumulator
) -> None:
    inputs, labels, task, mode = batch.inputs, batch.labels, model.task, plan.mode
    state = method.prepare(model, inputs, mode)
    base = method.predict(model, inputs, state, None, None, mode)
    wanted = set(plan.metrics)
    acc.add("count", torch.tensor([inputs.batch_size]))
    if labels is not None:
        acc.add("score", _scores(base.logits, labels, task))
    if "fidelity" in wanted:
        acc.add("fidelity", M.fidelity(base.logits, base.attributions, reduction="none"))
    used = _used_for_prediction(base, task)
    for name, fn in (("iou", M.group_iou), ("coverage", M.group_coverage), ("object_ratio", M.object_ratio)):
        if name in wanted:
            acc.add(name, fn(base.group_masks, _present(gt, "ground-truth mask"), used, reduction="none"))
    if "diversity" in wanted:
        for name, values in M.group_diversity(base.group_masks, candidate_mask(model, inputs), used).items():
            acc.add(name, values)
    if "purity" in wanted:
        maps = inputs.require_pixels().float().mean(dim=1).flatten(1)
        pixel_masks = _pixel_groups(model, inputs, base.group_masks)
        acc.add("purity", M.cosmogrid_purity(pixel_masks, maps, base.used, plan.tau_v, plan.tau_c, reduction="none"))
    if "leakage" in wanted:
        acc.add("masks", base.group_masks)
        acc.add("labels", _present(labels, "labels"))
    # The insertion curve doubles as the sparsity curve when both use the same sparsities.
    reuse = "sparsity" in wanted and plan.taus == plan.steps
    inserted = _steps(method, model, batch, state, plan.steps, True, mode) if "insertion" in wanted or reuse else None
    if inserted is not None and "insertion" in wanted:
        acc.add("insertion", _curve(inserted, labels, task, deletion=False))
    if "deletion" in wanted:
        acc.add("deletion", _curve(_steps(method, model, batch, state, plan.steps, False, mode), labels, task, True))
    if "sparsity" in wanted:
        y = _present(labels, "labels")
        sparse = (
            inserted if inserted is not None and reuse else _steps(method, model, batch, state, plan.taus, True, mode)
        )
        acc.add("sparsity", torch.stack([_scores(sparse[:, s], y, task) for s in range(len(plan.taus))], 1))
    if "num_groups" in wanted and isinstance(method, SOPMethod):
        y = _present(labels, "labels")
        rows = [method.predict(model, inputs, state, None, None, mode, num_groups=m).logits for m in plan.group_counts]
        acc.add("num_groups", torch.stack([_scores(r, y, task) for r in rows], dim=1))


def _finalize(acc: _Accumulator, plan: _Plan, task: str, num_classes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"examples": int(acc.cat("count").sum())}
    wanted = set(plan.metrics)
    if "score" in acc.values:
        score = float(acc.cat("score").mean())
        for name, value in (("accuracy", score), ("error", 1.0 - score), ("mse", score)):
            if name in wanted:
                out[name] = value
    for name in ("fidelity", "iou", "coverage", "purity"):
        if name in wanted:
            out[name] = float(acc.cat(name).nanmean())
    if "diversity" in wanted:
        for name in M.DIVERSITY:
            out[name] = float(acc.cat(name).nanmean())
    for name, taus in (("insertion", plan.steps), ("deletion", plan.steps)):
        if name in wanted:
            curve = acc.cat(name)
            out[name] = float(M.curve_auc(curve) if task == "regression" else M.relative_auc(curve))
            out[f"{name}_auc"] = float(M.curve_auc(curve))
            out[f"{name}_curve"] = {t: float(v) for t, v in zip(taus, curve.mean(dim=0))}
    if "sparsity" in wanted:
        out["sparsity"] = {t: float(v) for t, v in zip(plan.taus, acc.cat("sparsity").mean(dim=0))}
    if "num_groups" in acc.values:
        out["num_groups"] = {m: float(v) for m, v in zip(plan.group_counts, acc.cat("num_groups").mean(dim=0))}
    if "object_ratio" in wanted:
        out["object_ratio"] = M.object_ratio_by_correctness(acc.cat("object_ratio"), acc.cat("score") > 0.5)
    if "leakage" in wanted:
        out["leakage"] = M.leakage_probe(acc.cat_padded("masks"), acc.cat("labels"), num_classes=num_classes)
    return out


def evaluate(
    model: SOP,
    loader: Iterable,
    metrics: Iterable[str] | None = None,
    mode: str | None = None,
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
    print_table: bool = False,
) -> Results:
    """Evaluate ``model`` (and ``baselines``) on every batch of ``loader``; returns ``{method: {metric: value}}``.

    Args:
        model: a :class:`sopfast.SOP` (put in eval mode for the run, restored after).
        loader: batches in a format of this module's docstring.
        metrics: names from :data:`METRICS`; ``None``: accuracy (MSE for regression), fidelity,
            insertion, deletion, sparsity (+ iou, coverage when ``ground_truth_key`` is given).
        mode: ``"exact"`` / ``"drop"`` group execution (default: the model's).
        ground_truth_key: where batches keep the ground-truth mask (dict key or tuple position).
        baselines: names (:func:`sopfast.baselines.available_baselines`), :class:`Method`
            instances, or ``"all"``; each gets the same metrics (``num_groups`` is SOP-only).
        device: run there (the model is moved); default the model's device.
        progress: show a tqdm bar.
        taus: sparsities of the ``sparsity`` curve.  step: insertion/deletion step (10 %).
        group_counts: group counts of the ``num_groups`` ablation.
        tau_v, tau_c: CosmoGrid void / cluster thresholds of ``purity``.
        print_table: also print :func:`format_table` of the results.

    Per method: ``examples``; ``accuracy`` / ``error`` / ``mse``; ``fidelity`` (mean KL);
    ``insertion`` / ``deletion`` (AUC as a fraction of the full-input score; raw MSE AUC for
    regression) with ``*_auc`` and ``*_curve`` ``{τ: mean score}``; ``sparsity`` ``{τ: score}``;
    ``num_groups`` ``{m: score}``; ``iou``, ``coverage``, ``purity`` (means over examples with a
    defined value); ``object_ratio`` ``{correct, incorrect, num_correct, num_incorrect}``;
    ``leakage`` ``{accuracy, chance, num_train, num_test}``; ``diversity`` adds
    ``distinct_groups``, ``pairwise_iou``, ``union_coverage`` (over all ``m`` groups),
    ``groups_used`` and ``distinct_used_groups`` (groups the prediction uses), means over
    examples (:func:`sopfast.metrics.group_diversity`).
    """
    metrics = check_metrics(metrics, model.task, ground_truth_key is not None)
    if "purity" in metrics and model.adapter.modality != "image":
        raise ValueError("metric 'purity' (CosmoGrid void/cluster purity) needs an image model")
    plan = _Plan(
        metrics,
        check_mode(model.adapter, model.mode if mode is None else mode),
        check_taus(taus),
        step_taus(step),
        check_group_counts(group_counts),
        check_number("tau_v", tau_v),
        check_number("tau_c", tau_c),
    )
    check_bool("progress", progress)
    check_bool("print_table", print_table)
    if isinstance(ground_truth_key, bool) or not isinstance(ground_truth_key, (str, int, type(None))):
        raise ValueError(
            f"ground_truth_key must be a dict key (str), a tuple position (int) or None, got {ground_truth_key!r}"
        )
    methods: list[Method] = [SOPMethod(), *_resolve_baselines(baselines)]
    if device is None:
        device = next(model.parameters()).device
    else:
        device = resolve_device(device)
        model.to(device)
    accs = {m.name: _Accumulator() for m in methods}
    was_training = model.training
    model.eval()
    try:
        _run(model, loader, methods, accs, plan, ground_truth_key, device, progress)
    finally:
        model.train(was_training)
    results = {name: _finalize(acc, plan, model.task, model.num_classes) for name, acc in accs.items()}
    if print_table:
        print(format_table(results))
    return results


def _run(model, loader, methods, accs, plan: _Plan, ground_truth_key, device, progress: bool) -> None:
    total = len(loader) if hasattr(loader, "__len__") else None
    batches = 0
    with torch.no_grad():
        for raw in tqdm(loader, total=total, desc="sopfast evaluate", disable=not progress):
            batch = _prepare_batch(model, raw, ground_truth_key, device)
            _check_batch(batch, plan.metrics, model.task)
            gt = None
            if NEEDS_GROUND_TRUTH & set(plan.metrics):
                gt = feature_ground_truth(model, batch.inputs, _present(batch.ground_truth, "ground-truth mask"))
            for method in methods:
                _run_method(method, model, batch, gt, plan, accs[method.name])
            batches += 1
    if batches == 0:
        raise ValueError("loader yielded no batches; evaluate needs at least one example")


# -- presentation ---------------------------------------------------------------------------
SCALARS = (
    "accuracy",
    "error",
    "mse",
    "fidelity",
    "insertion",
    "deletion",
    "iou",
    "coverage",
    "purity",
    *M.DIVERSITY,
)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def _render(title: str, headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([title, line, "-" * len(line), *body])


def format_table(results: Results) -> str:
    """Plain-text tables of :func:`evaluate`'s results: scalar metrics, then one table per curve."""
    methods = list(results)
    sections = []
    cols = [c for c in SCALARS if any(c in results[m] for m in methods)]
    extra = [
        ("leakage", "accuracy", "leak acc"),
        ("leakage", "chance", "leak chance"),
        ("object_ratio", "correct", "obj correct"),
        ("object_ratio", "incorrect", "obj incorrect"),
    ]
    extra = [e for e in extra if any(e[0] in results[m] for m in methods)]
    headers = ["method", "examples", *cols, *(e[2] for e in extra)]
    rows = [
        [
            m,
            str(results[m]["examples"]),
            *(_fmt(results[m].get(c, "-")) for c in cols),
            *(_fmt(results[m][e[0]][e[1]]) if e[0] in results[m] else "-" for e in extra),
        ]
        for m in methods
    ]
    sections.append(_render("metrics", headers, rows))
    for curve, label in (("sparsity", "τ"), ("num_groups", "m"), ("insertion_curve", "τ"), ("deletion_curve", "τ")):
        owners = [m for m in methods if curve in results[m]]
        if owners:
            keys = list(results[owners[0]][curve])
            rows = [[m, *(_fmt(results[m][curve][k]) for k in keys)] for m in owners]
            sections.append(_render(curve, ["method", *(f"{label}={k:g}" for k in keys)], rows))
    return "\n\n".join(sections)


# -- command line ---------------------------------------------------------------------------
def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sopfast evaluate`` options to ``parser`` (the model / data options are the CLI's)."""
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=METRICS,
        default=None,
        help="metrics to compute (default: accuracy or mse, fidelity, insertion, deletion, sparsity)",
    )
    parser.add_argument(
        "--mode", choices=("exact", "drop"), default=None, help="group execution (default: the model's)"
    )
    parser.add_argument(
        "--baselines",
        nargs="+",
        default=None,
        metavar="NAME",
        help="baselines to compare with: 'all' or names from sopfast.baselines.BASELINES",
    )
    parser.add_argument(
        "--ground-truth-key",
        default=None,
        help="dict key (or tuple position) of the ground-truth masks for iou / coverage / object_ratio",
    )
    parser.add_argument("--device", default=None, help="e.g. cpu, cuda, cuda:1 (default: the model's)")
    parser.add_argument(
        "--taus", nargs="+", type=finite_float, default=list(TAUS), help="sparsities of the sparsity curve"
    )
    parser.add_argument(
        "--step", type=finite_float, default=0.1, help="insertion/deletion step as a fraction of features"
    )
    parser.add_argument(
        "--group-counts",
        nargs="+",
        type=int,
        default=list(GROUP_COUNTS),
        help="group counts of the num_groups ablation",
    )
    parser.add_argument("--tau-v", type=finite_float, default=0.6, help="CosmoGrid void threshold")
    parser.add_argument("--tau-c", type=finite_float, default=0.015, help="CosmoGrid cluster threshold")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--output", default=None, help="write the results as JSON to this path")


def run_cli(args: argparse.Namespace, model: SOP, loader: Iterable) -> Results:
    """Run :func:`evaluate` with the options of :func:`add_cli_arguments`; print the table, write JSON."""
    key = args.ground_truth_key
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    results = evaluate(
        model,
        loader,
        metrics=args.metrics,
        mode=args.mode,
        ground_truth_key=key,
        baselines=args.baselines,
        device=args.device,
        progress=not args.no_progress,
        taus=args.taus,
        step=args.step,
        group_counts=args.group_counts,
        tau_v=args.tau_v,
        tau_c=args.tau_c,
    )
    print(format_table(results))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)
    return results


__all__ = [
    "GROUP_COUNTS",
    "METRICS",
    "TAUS",
    "SOPMethod",
    "add_cli_arguments",
    "check_group_counts",
    "check_metrics",
    "check_taus",
    "evaluate",
    "feature_ground_truth",
    "format_table",
    "run_cli",
    "step_taus",
]
