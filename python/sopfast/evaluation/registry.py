"""The metrics :func:`sopfast.evaluate` computes, one registered :class:`Metric` each.

A metric takes one method's :class:`Step` on one batch — its base prediction, its predictions at
other sparsities or group counts, the labels and ground truth — and returns per-example values
to keep (:meth:`Metric.collect`); after the last batch it turns the kept values into results
(:meth:`Metric.finalize`).  A new metric is one registered :class:`Metric`: the runner has no
per-metric code.  Steps cache what several metrics share (the insertion curve is the sparsity
curve when their sparsities agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..adapters.images import upsample_mask
from ..checks import check_values
from ..types import FeatureInputs
from . import metrics as M
from .methods import Method, Prediction, SOPMethod, candidate_mask

if TYPE_CHECKING:
    from ..model.sop import SOP

Values = dict[str, torch.Tensor]
TASKS = ("classification", "regression")


@dataclass
class Plan:
    """What one :func:`sopfast.evaluate` call computes: metric names, the group execution mode, the
    sparsities of the sparsity curve, of the insertion/deletion steps, the group counts, the
    CosmoGrid thresholds, and the sparsities × group counts of the accuracy curves."""

    metrics: list[str]
    mode: str
    taus: list[float]
    steps: list[float]
    group_counts: list[int]
    tau_v: float
    tau_c: float
    curve_taus: list[float] = field(default_factory=list)
    curve_counts: list[int] = field(default_factory=list)


@dataclass
class Step:
    """One method on one batch: what the metrics read, computed once and shared."""

    method: Method
    model: SOP
    inputs: FeatureInputs
    labels: torch.Tensor | None
    ground_truth: torch.Tensor | None
    plan: Plan
    state: Any = None
    _curves: dict[tuple[tuple[float, ...], bool], torch.Tensor] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.model.task

    @cached_property
    def base(self) -> Prediction:
        """The method's prediction at the model's own τ."""
        return self.method.predict(self.model, self.inputs, self.state, None, None, self.plan.mode)

    @cached_property
    def reference(self) -> torch.Tensor:
        """``[B, C]``: the frozen backbone's logits on the whole input (:meth:`sopfast.SOP.reference_logits`)."""
        return self.model.reference_logits(self.inputs)

    @cached_property
    def used(self) -> torch.Tensor:
        """``[B, m]``: the groups used for the predicted class (any output, for regression)."""
        used = self.base.used
        if self.task == "regression":
            return used.any(dim=1)
        top = self.base.logits.argmax(dim=-1).view(-1, 1, 1).expand(-1, 1, used.shape[-1])
        return used.gather(1, top).squeeze(1)

    def need_labels(self) -> torch.Tensor:
        if self.labels is None:
            raise ValueError("this metric needs labels, but the batch has none")
        return self.labels

    def need_ground_truth(self) -> torch.Tensor:
        if self.ground_truth is None:
            raise ValueError("this metric needs ground-truth masks, but the batch has none")
        return self.ground_truth

    def predict(self, tau: float | None, num_groups: int | None = None) -> Prediction:
        """The method's prediction at sparsity ``tau`` with its first ``num_groups`` groups (methods that
        :attr:`~sopfast.evaluation.methods.Method.varies_groups`)."""
        return self.method.predict(self.model, self.inputs, self.state, tau, None, self.plan.mode, num_groups)

    def at(self, taus: list[float], largest: bool) -> torch.Tensor:
        """``[B, S, C]`` logits with groups of each sparsity of ``taus`` (the highest-ranked features,
        or the lowest when not ``largest``)."""
        key = (tuple(taus), largest)
        if key not in self._curves:
            logits = [
                self.method.predict(self.model, self.inputs, self.state, t, largest, self.plan.mode).logits
                for t in taus
            ]
            self._curves[key] = torch.stack(logits, dim=1)
        return self._curves[key]

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-example accuracy (0/1) or MSE of ``logits [B, C]``."""
        if self.task == "regression":
            return M.mse(logits, self.need_labels(), reduction="none")
        return M.accuracy(logits, self.need_labels(), reduction="none")


@dataclass(frozen=True)
class Metric:
    """One metric: ``collect(step) → {key: per-example values}`` on every batch, ``finalize(kept, plan,
    model) → {result name: value}`` at the end (``kept``: each key's values concatenated).

    ``needs_labels``: the model tasks for which batches must hold labels; ``needs_ground_truth``:
    batches must hold ground-truth masks; ``tasks``: the model tasks it applies to; ``sop_only``: the
    baselines skip it; ``default``: computed when no metrics are named.  Values whose last dimension
    differs between batches (text lengths) are zero-padded when kept.
    """

    name: str
    collect: Callable[[Step], Values]
    finalize: Callable[[dict[str, torch.Tensor], Plan, SOP], dict[str, Any]]
    needs_labels: tuple[str, ...] = ()
    needs_ground_truth: bool = False
    tasks: tuple[str, ...] = TASKS
    sop_only: bool = False
    default: bool = False


REGISTRY: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    """Make ``metric`` available to :func:`sopfast.evaluate` under ``metric.name``."""
    if metric.name in REGISTRY:
        raise ValueError(f"metric {metric.name!r} is already registered")
    REGISTRY[metric.name] = metric
    return metric


def metric_names() -> tuple[str, ...]:
    """The names of the registered metrics, now (those added with :func:`register_metric` too)."""
    return tuple(REGISTRY)


def _mean(name: str) -> Callable[[dict[str, torch.Tensor], Plan, Any], dict[str, Any]]:
    return lambda kept, plan, model: {name: float(kept[name].nanmean())}


# -- prediction quality ---------------------------------------------------------------------------
register_metric(
    Metric(
        "accuracy",
        lambda s: {"accuracy": s.scores(s.base.logits)},
        _mean("accuracy"),
        needs_labels=TASKS,
        tasks=("classification",),
        default=True,
    )
)
register_metric(
    Metric(
        "error",
        lambda s: {"error": 1.0 - s.scores(s.base.logits)},
        _mean("error"),
        needs_labels=TASKS,
        tasks=("classification",),
    )
)
register_metric(
    Metric(
        "mse",
        lambda s: {"mse": s.scores(s.base.logits)},
        _mean("mse"),
        needs_labels=TASKS,
        tasks=("regression",),
        default=True,
    )
)
register_metric(
    Metric(
        "fidelity",
        lambda s: {"fidelity": M.fidelity(s.base.logits, s.base.attributions, reduction="none")},
        _mean("fidelity"),
        default=True,
    )
)


register_metric(
    Metric(
        "agreement",
        lambda s: {
            "agreement": M.agreement(s.base.logits, s.reference, reduction="none"),
            "agreement_kl": M.agreement_kl(s.base.logits, s.reference, reduction="none"),
        },
        lambda kept, plan, model: {k: float(kept[k].mean()) for k in ("agreement", "agreement_kl")},
        tasks=("classification",),
        default=True,
    )
)
BOUNDS = ("generator_bound", "one_group_agrees", "generator_bound_correct", "selector_bound", "selector_misses")


def _group_logits(step: Step) -> torch.Tensor:
    """``[B, m, C]``: the backbone on each of the method's groups alone (a ValueError for a method without)."""
    if step.base.group_logits is None:
        raise ValueError(f"metric 'bounds' needs each group's logits, which method {step.method.name!r} does not give")
    return step.base.group_logits


register_metric(
    Metric(
        "bounds",
        lambda s: M.group_bounds(_group_logits(s), s.reference, s.labels, s.base.logits),
        lambda kept, plan, model: {k: float(kept[k].mean()) for k in BOUNDS if k in kept},
        tasks=("classification",),
    )
)


# -- insertion, deletion, sparsity, group counts ----------------------------------------------------
def _curve(step: Step, deletion: bool) -> torch.Tensor:
    logits = step.at(step.plan.steps, largest=not deletion)
    if step.task == "regression":
        return M.mse_curve(logits, step.need_labels())
    return M.probability_curve(logits, penalize_switch=deletion)


def _auc(name: str) -> Callable[[dict[str, torch.Tensor], Plan, Any], dict[str, Any]]:
    def finalize(kept: dict[str, torch.Tensor], plan: Plan, model: Any) -> dict[str, Any]:
        curve = kept[name]
        score = M.curve_auc(curve) if model.task == "regression" else M.relative_auc(curve)
        return {
            name: float(score),
            f"{name}_auc": float(M.curve_auc(curve)),
            f"{name}_curve": {t: float(v) for t, v in zip(plan.steps, curve.mean(dim=0))},
        }

    return finalize


def _sparsity(step: Step) -> Values:
    logits = step.at(step.plan.taus, largest=True)
    return {"sparsity": torch.stack([step.scores(logits[:, i]) for i in range(len(step.plan.taus))], dim=1)}


def _num_groups(step: Step) -> Values:
    method = step.method
    if not isinstance(method, SOPMethod):
        return {}
    rows = [
        method.predict(step.model, step.inputs, step.state, None, None, step.plan.mode, num_groups=m).logits
        for m in step.plan.group_counts
    ]
    return {"num_groups": torch.stack([step.scores(r) for r in rows], dim=1)}


register_metric(
    Metric(
        "insertion",
        lambda s: {"insertion": _curve(s, False)},
        _auc("insertion"),
        needs_labels=("regression",),
        default=True,
    )
)
register_metric(
    Metric(
        "deletion",
        lambda s: {"deletion": _curve(s, True)},
        _auc("deletion"),
        needs_labels=("regression",),
        default=True,
    )
)
register_metric(
    Metric(
        "sparsity",
        _sparsity,
        lambda kept, plan, model: {"sparsity": {t: float(v) for t, v in zip(plan.taus, kept["sparsity"].mean(0))}},
        needs_labels=TASKS,
        default=True,
    )
)
register_metric(
    Metric(
        "num_groups",
        _num_groups,
        lambda kept, plan, model: (
            {"num_groups": {m: float(v) for m, v in zip(plan.group_counts, kept["num_groups"].mean(0))}}
            if "num_groups" in kept
            else {}
        ),
        needs_labels=TASKS,
        sop_only=True,
    )
)


# -- the paper's curves: accuracy over inference sparsity × group count ---------------------------
def curve_key(tau: float, num_groups: int | None) -> str:
    """``"τ/m"`` (``"τ"`` for a method whose group count does not vary)."""
    return f"{tau:g}" if num_groups is None else f"{tau:g}/{num_groups}"


def _curves(step: Step) -> Values:
    """Accuracy (or MSE) at every sparsity of ``plan.curve_taus``; for methods with several groups,
    at every group count of ``plan.curve_counts`` too (up to the groups they have)."""
    counts: list[int | None] = [None]
    if step.method.varies_groups:
        available = step.base.group_masks.shape[1] if not isinstance(step.method, SOPMethod) else None
        counts = [m for m in step.plan.curve_counts if available is None or m <= available]
    return {
        f"curve:{curve_key(t, m)}": step.scores(step.predict(t, m).logits) for t in step.plan.curve_taus for m in counts
    }


def _curves_finalize(kept: dict[str, torch.Tensor], plan: Plan, model: Any) -> dict[str, Any]:
    keys = [k for k in kept if k.startswith("curve:")]
    return {"curves": {k.removeprefix("curve:"): float(kept[k].mean()) for k in keys}}


register_metric(Metric("curves", _curves, _curves_finalize, needs_labels=TASKS, default=True))


# -- groups against ground truth ------------------------------------------------------------------
def feature_ground_truth(model: SOP, inputs: FeatureInputs, gt: torch.Tensor) -> torch.Tensor:
    """Ground truth at feature level ``[B, d]`` bool from ``[B, d]``, ``[B, h, w]`` (grid) or ``[B, H, W]`` (pixels)."""
    b, d = inputs.batch_size, model.adapter.num_features(inputs)
    grid = model.adapter.feature_grid(inputs)
    if gt.is_floating_point() and gt.numel():
        check_values(
            torch.isfinite(gt).all(), "ground-truth masks must be finite (1 = object, 0 = not), got NaN or Inf"
        )
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


def _defined_mean(name: str) -> Callable[[dict[str, torch.Tensor], Plan, Any], dict[str, Any]]:
    """The mean over examples where ``name`` is defined (a non-empty ground truth); a ValueError when it is
    defined for none (every ground-truth mask empty)."""

    def finalize(kept: dict[str, torch.Tensor], plan: Plan, model: Any) -> dict[str, Any]:
        values = kept[name]
        if values.numel() and bool(values.isnan().all()):
            raise ValueError(
                f"metric {name!r}: every ground-truth mask is empty (no object feature in any example), so "
                f"{name} is undefined; check the masks (--object-masks, ground_truth_key)"
            )
        return {name: float(values.nanmean())}

    return finalize


def _against_ground_truth(name: str, fn: Callable[..., torch.Tensor]) -> Metric:
    return Metric(
        name,
        lambda s: {name: fn(s.base.group_masks, s.need_ground_truth(), s.used, reduction="none")},
        _defined_mean(name),
        needs_ground_truth=True,
    )


register_metric(_against_ground_truth("iou", M.group_iou))
register_metric(_against_ground_truth("coverage", M.group_coverage))
register_metric(
    Metric(
        "object_ratio",
        lambda s: {
            "object_ratio": M.object_ratio(s.base.group_masks, s.need_ground_truth(), s.used, reduction="none"),
            "object_ratio_correct": s.scores(s.base.logits),
        },
        lambda kept, plan, model: {
            "object_ratio": M.object_ratio_by_correctness(kept["object_ratio"], kept["object_ratio_correct"] > 0.5)
        },
        needs_labels=TASKS,
        needs_ground_truth=True,
        tasks=("classification",),
    )
)


def _grounding(step: Step) -> Values:
    """Per example: the share of a group's features on the object (all groups, and the used ones)
    and the groups' IoU with the object (paper RQ5)."""
    masks, gt = step.base.group_masks, step.need_ground_truth()
    every = torch.ones_like(step.used)
    return {
        "on_object": M.object_ratio(masks, gt, every, reduction="none"),
        "on_object_used": M.object_ratio(masks, gt, step.used, reduction="none"),
        "object_iou": M.group_iou(masks, gt, every, reduction="none"),
    }


register_metric(
    Metric(
        "grounding",
        _grounding,
        lambda kept, plan, model: {k: float(kept[k].nanmean()) for k in ("on_object", "on_object_used", "object_iou")},
        needs_ground_truth=True,
    )
)


#: The paper's purity threshold ablation (appendix, "CosmoGrid Purity Threshold Ablations"): ``(τ_v, τ_c)``,
#: τ_v varied at τ_c = 0.015, then τ_c at τ_v = 0.6.
PURITY_THRESHOLDS = (
    (0.2, 0.015),
    (0.4, 0.015),
    (0.6, 0.015),
    (0.8, 0.015),
    (0.6, 0.005),
    (0.6, 0.01),
    (0.6, 0.02),
)


def _purity(step: Step) -> Values:
    """Each group's void and cluster alignment (at pixel resolution) and the groups each output uses."""
    inputs = step.inputs
    grid = step.model.adapter.feature_grid(inputs)
    if grid is None:
        raise ValueError(f"pixel-level metrics need a feature grid; {type(step.model.adapter).__name__} has none")
    pixels = inputs.require_pixels()
    masks = step.base.group_masks
    b, m, _ = masks.shape
    pixel_masks = upsample_mask(masks.reshape(b * m, *grid), (int(pixels.shape[-2]), int(pixels.shape[-1])))
    void, cluster = M.cosmogrid_alignment(pixel_masks.reshape(b, m, -1), pixels.float().mean(dim=1).flatten(1))
    return {"purity_void": void, "purity_cluster": cluster, "purity_used": step.base.used}


def _purity_finalize(kept: dict[str, torch.Tensor], plan: Plan, model: Any) -> dict[str, Any]:
    """``purity`` at the plan's thresholds and ``purity_thresholds`` ``{"τ_v/τ_c": purity}`` at
    :data:`PURITY_THRESHOLDS` (means over examples whose outputs use a group)."""

    def purity(tau_v: float, tau_c: float) -> float:
        values = M.purity_of_alignments(
            kept["purity_void"], kept["purity_cluster"], kept["purity_used"], tau_v, tau_c, reduction="none"
        )
        return float(values.nanmean())

    grid = {f"{v:g}/{c:g}": purity(v, c) for v, c in PURITY_THRESHOLDS}
    return {"purity": purity(plan.tau_v, plan.tau_c), "purity_thresholds": grid}


register_metric(Metric("purity", _purity, _purity_finalize))


# -- the groups themselves --------------------------------------------------------------------------
register_metric(
    Metric(
        "diversity",
        lambda s: M.group_diversity(s.base.group_masks, candidate_mask(s.model, s.inputs), s.used),
        lambda kept, plan, model: {name: float(kept[name].nanmean()) for name in M.DIVERSITY},
    )
)
register_metric(
    Metric(
        "leakage",
        lambda s: {"leakage_masks": s.base.group_masks, "leakage_labels": s.need_labels()},
        lambda kept, plan, model: {
            "leakage": M.leakage_probe(kept["leakage_masks"], kept["leakage_labels"], num_classes=model.num_classes)
        },
        needs_labels=TASKS,
        tasks=("classification",),
    )
)
