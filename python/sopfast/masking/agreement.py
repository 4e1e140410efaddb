"""How far an explainer's attributions move when its masked inputs run in another mode: the check to
make before trading a ViT's faithful ``exact`` path for the faster ``drop`` one.

    report = sopfast.masking.agreement(vit, images, explainer="kernelshap", samples=200)
    report.median_spearman, report.mean_top_overlap   # 1.0 and 1.0 would mean the same explanations
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from ..adapters import BackboneAdapter
from ..adapters.base import check_mode
from ..checks import check_int, check_tau
from .captum import MaskedForward
from .explainers import EXPLAINERS, Explainer
from .forward import InputsLike, UnfaithfulModeWarning, adapter_of, feature_inputs

#: An explainer of your own: ``explainer(forward, target [B]) → [B, d]`` on a :class:`MaskedForward`.
ExplainerFn = Callable[[MaskedForward, torch.Tensor], torch.Tensor]


@dataclass
class Agreement:
    """Per-example agreement of one explainer's attributions in two modes.

    Attributes:
        spearman: ``[B]`` Spearman rank correlation over each example's candidate features (1 where
            both attributions are constant).
        top_overlap: ``[B]`` intersection over union of the two top-``top`` feature sets.
        attributions: ``{mode: [B, d]}`` the two attributions.
    """

    explainer: str
    modes: tuple[str, str]
    top: float
    spearman: torch.Tensor
    top_overlap: torch.Tensor
    attributions: dict[str, torch.Tensor]

    @property
    def median_spearman(self) -> float:
        return float(self.spearman.median())

    @property
    def mean_top_overlap(self) -> float:
        return float(self.top_overlap.mean())

    def __str__(self) -> str:
        a, b = self.modes
        return (
            f"{self.explainer}, {a} vs {b} on {len(self.spearman)} examples: median Spearman "
            f"{self.median_spearman:.2f}, top-{self.top:.0%} overlap {self.mean_top_overlap:.2f} (1 = the same)"
        )


def agreement(
    backbone: nn.Module | BackboneAdapter,
    inputs: InputsLike,
    target: torch.Tensor | None = None,
    *,
    explainer: str | ExplainerFn = "kernelshap",
    modes: tuple[str, str] = ("exact", "drop"),
    samples: int = 200,
    top: float = 0.2,
    seed: int = 0,
) -> Agreement:
    """Run ``explainer`` on ``inputs`` once per mode of ``modes`` (same seed) and compare the attributions.

    Args:
        backbone: a backbone sopfast has an adapter for, an :class:`sopfast.SOP` or an adapter.
        inputs: a few examples (images ``[B, C, H, W]`` or a mapping of ``input_ids`` ...).
        target: ``[B]`` classes to explain (default: the backbone's prediction on the full input).
        explainer: the name of an explainer that runs masked inputs (:data:`sopfast.masking.EXPLAINERS`:
            ``kernelshap``, ``lime``, ``occlusion``, ``feature_ablation``, ``shapley_sampling``, ``rise``) or
            ``explainer(forward, target) → [B, d]`` on a :class:`MaskedForward` (Captum's methods need
            ``pip install captum``).
        modes: the two modes to compare (``exact`` is the backbone's own function).
        samples: perturbations per example: KernelSHAP / LIME samples, RISE masks, ``samples // 10``
            Shapley permutations (occlusion and feature ablation remove one feature at a time).
        top: the share of features whose top sets are compared.
        seed: seeds the sampling (the same in both modes).
    """
    adapter = adapter_of(backbone)
    if not isinstance(modes, tuple) or len(modes) != 2:
        raise ValueError(f"modes must be a pair of modes such as ('exact', 'drop'), got {modes!r}")
    for mode in modes:
        check_mode(adapter, mode)
    check_int("samples", samples, 1)
    check_tau(top, "top")
    named = None if callable(explainer) else _masked_explainer(explainer)
    name = explainer if isinstance(explainer, str) else getattr(explainer, "__name__", "explainer")
    batch = feature_inputs(adapter, inputs)
    if target is None:
        with torch.no_grad():
            target = adapter.full_forward(batch)[0].argmax(-1)
    results = {}
    for mode in modes:
        with warnings.catch_warnings():  # the modes are compared on purpose; Captum's note on batches says nothing
            warnings.simplefilter("ignore", UnfaithfulModeWarning)
            warnings.filterwarnings("ignore", message="You are providing multiple inputs for Lime")
            if named is not None:
                results[mode] = named(adapter, batch, target, mode=mode, seed=seed, **named.budget(samples))
                continue
            forward = MaskedForward(adapter, batch, mode=mode)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                results[mode] = cast(ExplainerFn, explainer)(forward, target).detach().float()
    valid = adapter.candidate_mask(batch)
    first, second = (results[m] for m in modes)
    rho = torch.stack([spearman(first[i][valid[i]], second[i][valid[i]]) for i in range(batch.batch_size)])
    overlap = torch.stack([top_overlap(first[i][valid[i]], second[i][valid[i]], top) for i in range(batch.batch_size)])
    return Agreement(name, modes, top, rho, overlap, results)


def _masked_explainer(name: object) -> Explainer:
    """The registered explainer ``name``, one that runs masked inputs (the modes are what it compares)."""
    masked = tuple(n for n, e in EXPLAINERS.items() if e.masked)
    if not isinstance(name, str) or name not in masked:
        raise ValueError(f"explainer must be one of {masked} or a callable, got {name!r}")
    return EXPLAINERS[name]


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks of ``x [n]`` from 0, ties given their mean rank."""
    order = x.argsort()
    sorted_x = x[order]
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts
    mean_rank = first.double() + (counts.double() - 1) / 2
    ranks = torch.empty_like(mean_rank[inverse])
    ranks[order] = mean_rank[inverse]
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of two ``[n]`` vectors (ties at their mean rank); 1 when both are
    constant (nothing to rank differently), 0 when only one is."""
    ra, rb = _ranks(a.double()), _ranks(b.double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    na, nb = ra.norm(), rb.norm()
    if na == 0 or nb == 0:
        return torch.tensor(1.0 if na == nb else 0.0)
    return ((ra @ rb) / (na * nb)).float()


def top_overlap(a: torch.Tensor, b: torch.Tensor, top: float) -> torch.Tensor:
    """Intersection over union of the ``max(1, round(top · n))`` largest entries of ``a`` and of ``b``."""
    k = max(1, round(top * len(a)))
    first, second = set(a.topk(k).indices.tolist()), set(b.topk(k).indices.tolist())
    return torch.tensor(len(first & second) / len(first | second))
