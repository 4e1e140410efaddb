"""The one registry of explainers by name: Captum's perturbation methods run on :class:`MaskedForward`,
:func:`sopfast.rise`, and Integrated Gradients on the adapter's ``soft_forward``.  ``sopfast.predict``
(``explainer=``), :func:`sopfast.masking.agreement`, the "-F" baselines of :func:`sopfast.evaluate` and
``sopfast predict --explainer`` all build their explainers here; a new one is one :class:`Explainer` given
to :func:`register_explainer`.

    attributions = EXPLAINERS["kernelshap"](backbone, images, target, seed=0, n_samples=200)   # [B, d]
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ..adapters import BackboneAdapter
from ..checks import check_int
from ..types import FeatureInputs
from .captum import MaskedForward
from .forward import InputsLike, adapter_of, feature_inputs
from .rise import rise

#: ``(adapter, inputs, target [B], mode, seed, options) → [B, d]``: an explainer on checked arguments (the
#: global generator already seeded with ``seed`` when it is not ``None``).
Attribute = Callable[
    [BackboneAdapter, FeatureInputs, torch.Tensor, "str | None", "int | None", dict[str, Any]], torch.Tensor
]
#: The built-in explainers' names (the ``explainer`` choices of ``sopfast.predict`` and its command).
ExplainerName = Literal["rise", "kernelshap", "lime", "occlusion", "feature_ablation", "shapley_sampling", "ig"]
INPUT_FIELDS = ("pixels", "input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class Explainer:
    """An explainer by name: ``attribute`` computes the attributions, ``options`` are the keyword options it
    takes, ``needs`` the packages it imports, ``budget(n)`` the options that spend about ``n`` forward passes
    per example, ``masked``: whether it runs masked inputs in a mode (``False``: the full input, gradients),
    ``counts``: whether every option is a count (an integer ≥ 1, checked before a run; RISE checks its own)."""

    name: str
    attribute: Attribute
    options: tuple[str, ...]
    needs: tuple[str, ...] = ()
    budget: Callable[[int], dict[str, int]] = field(default=lambda n: {})
    masked: bool = True
    counts: bool = True

    def missing(self) -> list[str]:
        """The packages of :attr:`needs` that cannot be imported here."""
        return [n for n in self.needs if importlib.util.find_spec(n) is None]

    def check_options(self, options: Mapping[str, Any] | None, where: str = "explainer_options") -> dict[str, Any]:
        """``options`` checked against :attr:`options` (ValueError naming ``where`` and what is allowed; the
        counts positive integers), ImportError when a package it needs is missing."""
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"{where} must be a dict of option → value, got {type(options).__name__}")
        checked = dict(options or {})
        unknown = sorted(set(checked) - set(self.options))
        if unknown:
            raise ValueError(f"{where} {unknown} are not options of {self.name!r}; allowed: {list(self.options)}")
        if self.counts:
            for key, value in checked.items():
                checked[key] = check_int(f"{where}[{key!r}]", value, 1)
        missing = self.missing()
        if missing:
            raise ImportError(f"explainer {self.name!r} needs {missing}: pip install captum scikit-learn")
        return checked

    def __call__(
        self,
        backbone: nn.Module | BackboneAdapter,
        inputs: InputsLike,
        target: torch.Tensor,
        *,
        mode: str | None = None,
        seed: int | None = None,
        **options: Any,
    ) -> torch.Tensor:
        """Attributions ``[B, d]`` (float) of class ``target [B]`` over the adapter's features; masked inputs
        run in ``mode`` (``None``: the backbone's faithful mode); ``seed``: the random draws start from
        ``torch.manual_seed(seed)`` (the global generator is left as it was), ``None`` draws from it."""
        adapter = adapter_of(backbone)
        batch = feature_inputs(adapter, inputs)
        checked = self.check_options(options, "options")
        if seed is not None:
            check_int("seed", seed, 0)
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            return self.attribute(adapter, batch, target, mode, seed, checked).detach().float()


EXPLAINERS: dict[str, Explainer] = {}


def register_explainer(explainer: Explainer) -> Explainer:
    """Add ``explainer`` to :data:`EXPLAINERS` (a name taken is a ValueError)."""
    if not isinstance(explainer, Explainer):
        raise TypeError(f"explainer must be a sopfast.masking.Explainer, got {type(explainer).__name__}")
    if explainer.name in EXPLAINERS:
        raise ValueError(f"explainer {explainer.name!r} is already registered")
    EXPLAINERS[explainer.name] = explainer
    return explainer


def get_explainer(name: str, allowed: str = "") -> Explainer:
    """The explainer called ``name`` (ValueError naming the choices, and ``allowed``'s words, otherwise)."""
    if not isinstance(name, str) or name not in EXPLAINERS:
        raise ValueError(f"explainer must be one of {tuple(EXPLAINERS)}{allowed}, got {name!r}")
    return EXPLAINERS[name]


# -- the built-in explainers ----------------------------------------------------------------------------
def _rise(adapter: BackboneAdapter, inputs: FeatureInputs, target: torch.Tensor, mode: str | None, seed, options):
    return rise(adapter, inputs, target, mode=mode, seed=0 if seed is None else seed, **options)


@contextmanager
def _quiet_surrogate_fit() -> Iterator[None]:
    """Without two warnings that say nothing here: scikit-learn's ``ConvergenceWarning`` from LIME's
    Lasso surrogate (at a budget of a few hundred samples its coordinate descent often stops at
    ``max_iter``; the attribution is still the fitted coefficients, what Captum returns), and
    Captum's note that a batch fits one surrogate per example (it does, as intended)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are providing multiple inputs for Lime")
        try:
            from sklearn.exceptions import ConvergenceWarning
        except ImportError:
            yield
            return
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def _masked(
    adapter: BackboneAdapter, inputs: FeatureInputs, target: torch.Tensor, mode: str | None, options: dict
) -> tuple[MaskedForward, dict[str, Any]]:
    """The :class:`MaskedForward` in ``mode`` and the keywords every Captum method takes."""
    calls = {"tokens_per_call": options["tokens_per_call"]} if "tokens_per_call" in options else {}
    forward = MaskedForward(adapter, inputs, mode=mode, **calls)
    return forward, {"target": target, "additional_forward_args": forward.example_ids}


def _surrogate(method: str) -> Attribute:
    """LIME or KernelSHAP: ``n_samples`` (25) binary masks per example, ``perturbations_per_eval`` (all) per call."""

    def attribute(adapter, inputs, target, mode, _seed, options) -> torch.Tensor:
        import captum.attr as ca

        forward, common = _masked(adapter, inputs, target, mode, options)
        samples = options.get("n_samples", 25)
        explainer = ca.Lime(forward) if method == "lime" else ca.KernelShap(forward)
        with _quiet_surrogate_fit():
            return explainer.attribute(
                forward.presence,
                n_samples=samples,
                perturbations_per_eval=options.get("perturbations_per_eval", samples),
                **common,
            )

    return attribute


def _occlusion(adapter, inputs, target, mode, _seed, options) -> torch.Tensor:
    """Occlusion: ``window`` (1) consecutive features removed at a time, also its stride; every window in one
    call unless ``perturbations_per_eval`` says otherwise."""
    import captum.attr as ca

    forward, common = _masked(adapter, inputs, target, mode, options)
    window = options.get("window", 1)
    return ca.Occlusion(forward).attribute(
        forward.presence,
        sliding_window_shapes=(window,),
        strides=window,
        perturbations_per_eval=options.get("perturbations_per_eval", -(-forward.presence.shape[1] // window)),
        **common,
    )


def _feature_ablation(adapter, inputs, target, mode, _seed, options) -> torch.Tensor:
    """Feature ablation: each feature removed alone, every one in one call by default."""
    import captum.attr as ca

    forward, common = _masked(adapter, inputs, target, mode, options)
    per_eval = options.get("perturbations_per_eval", forward.presence.shape[1])
    return ca.FeatureAblation(forward).attribute(forward.presence, perturbations_per_eval=per_eval, **common)


def _shapley_sampling(adapter, inputs, target, mode, _seed, options) -> torch.Tensor:
    """Shapley value sampling: ``n_samples`` (25) random orders of the features, one order per call by default."""
    import captum.attr as ca

    forward, common = _masked(adapter, inputs, target, mode, options)
    return ca.ShapleyValueSampling(forward).attribute(
        forward.presence,
        n_samples=options.get("n_samples", 25),
        perturbations_per_eval=options.get("perturbations_per_eval", forward.presence.shape[1]),
        **common,
    )


def _fields(inputs: FeatureInputs) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    names = tuple(n for n in INPUT_FIELDS if getattr(inputs, n) is not None)
    return names, tuple(getattr(inputs, n) for n in names)


def _integrated_gradients(adapter, inputs, target, _mode, _seed, options) -> torch.Tensor:
    """Integrated Gradients from the blank input along the adapter's ``soft_forward``, ``n_steps`` (20) steps
    (the full input: no mode)."""
    import captum.attr as ca

    names, tensors = _fields(inputs)
    ones = torch.ones(inputs.batch_size, adapter.num_features(inputs), device=inputs.device)

    def forward(z: torch.Tensor, *fields: torch.Tensor) -> torch.Tensor:
        return adapter.soft_forward(FeatureInputs(**dict(zip(names, fields))), z)

    with torch.enable_grad():
        return ca.IntegratedGradients(forward).attribute(
            ones,
            baselines=0.0,
            target=target,
            additional_forward_args=tensors,
            n_steps=options.get("n_steps", 20),
            internal_batch_size=options.get("internal_batch_size"),
        )


_SAMPLED = ("n_samples", "perturbations_per_eval", "tokens_per_call")
_SURROGATE_NEEDS = ("captum", "sklearn")
for _explainer in (
    Explainer(
        "rise",
        _rise,
        ("num_masks", "keep", "cells", "tokens_per_call"),
        budget=lambda n: {"num_masks": n},
        counts=False,
    ),
    Explainer("kernelshap", _surrogate("kernelshap"), _SAMPLED, _SURROGATE_NEEDS, lambda n: {"n_samples": n}),
    Explainer("lime", _surrogate("lime"), _SAMPLED, _SURROGATE_NEEDS, lambda n: {"n_samples": n}),
    Explainer("occlusion", _occlusion, ("window", "perturbations_per_eval", "tokens_per_call"), ("captum",)),
    Explainer("feature_ablation", _feature_ablation, ("perturbations_per_eval", "tokens_per_call"), ("captum",)),
    Explainer("shapley_sampling", _shapley_sampling, _SAMPLED, ("captum",), lambda n: {"n_samples": max(1, n // 10)}),
    Explainer(
        "ig", _integrated_gradients, ("n_steps", "internal_batch_size"), ("captum",), lambda n: {"n_steps": n}, False
    ),
):
    register_explainer(_explainer)
