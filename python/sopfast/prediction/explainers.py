"""Perturbation explainers over a dataset, on sopfast's masked inference (:mod:`sopfast.masking`).

Each example is explained alone, with the same ``seed``: row ``i``'s attributions equal the explainer
run on example ``i`` by itself (``sopfast.rise(backbone, x[i:i+1], target[i:i+1], seed=seed)``), so
they do not depend on the batch size, the number of processes or a resumed run.  ``mode`` ``None``
leaves :mod:`sopfast.masking`'s default mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..adapters import BackboneAdapter
from ..adapters.images import upsample_mask
from ..checks import check_int
from ..evaluation.attributions import _quiet_surrogate_fit
from ..masking import MaskedForward, rise
from ..types import FeatureInputs

EXPLAINERS = ("rise", "kernelshap", "lime", "occlusion")
#: The options each explainer takes (``explainer_options``), passed to :func:`sopfast.rise` or to
#: Captum's ``attribute``; ``window``: Occlusion's sliding window (features), also its stride.
OPTIONS = {
    "rise": ("num_masks", "keep", "cells", "tokens_per_call"),
    "kernelshap": ("n_samples", "perturbations_per_eval", "tokens_per_call"),
    "lime": ("n_samples", "perturbations_per_eval", "tokens_per_call"),
    "occlusion": ("window", "perturbations_per_eval", "tokens_per_call"),
}


def check_explainer(name: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` checked against ``name``'s (:data:`OPTIONS`), the Captum explainers' values positive
    integers; ValueError naming what is allowed."""
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"explainer_options must be a dict of option → value, got {type(options).__name__}")
    options = dict(options or {})
    if name is None:
        if options:
            raise ValueError(f"explainer_options {sorted(options)} given without an explainer; allowed: {EXPLAINERS}")
        return options
    if name not in EXPLAINERS:
        raise ValueError(f"explainer must be one of {EXPLAINERS} or None, got {name!r}")
    unknown = sorted(set(options) - set(OPTIONS[name]))
    if unknown:
        raise ValueError(f"explainer_options {unknown} are not options of {name!r}; allowed: {list(OPTIONS[name])}")
    if name != "rise":  # sopfast.rise checks its own options
        for key, value in options.items():
            options[key] = check_int(f"explainer_options[{key!r}]", value, 1)
        import importlib.util

        needed = ["captum"] + (["sklearn"] if name in ("lime", "kernelshap") else [])
        missing = [n for n in needed if importlib.util.find_spec(n) is None]
        if missing:
            raise ImportError(f"explainer {name!r} needs {missing}: pip install captum scikit-learn")
    return options


def explain(
    name: str,
    adapter: BackboneAdapter,
    inputs: FeatureInputs,
    target: torch.Tensor,
    mode: str | None,
    seed: int,
    options: dict[str, Any],
) -> torch.Tensor:
    """Attributions ``[B, d]`` of class ``target [B]`` by explainer ``name``, one example at a time
    (module docstring)."""
    moded: dict[str, Any] = {} if mode is None else {"mode": mode}
    rows = []
    for i in range(inputs.batch_size):
        one, goal = inputs.rows(slice(i, i + 1)), target[i : i + 1]
        if name == "rise":
            rows.append(rise(adapter, one, goal, seed=seed, **moded, **options))
            continue
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            rows.append(_captum(name, adapter, one, goal, moded, options))
    return torch.cat(rows).float()


def _captum(
    name: str,
    adapter: BackboneAdapter,
    inputs: FeatureInputs,
    target: torch.Tensor,
    moded: dict[str, Any],
    options: dict[str, Any],
) -> torch.Tensor:
    import captum.attr as ca

    options = dict(options)
    calls = {k: options.pop(k) for k in ("tokens_per_call",) if k in options}
    forward = MaskedForward(adapter, inputs, **moded, **calls)
    common = {"target": target, "additional_forward_args": forward.example_ids}
    if name == "occlusion":
        window = int(options.pop("window", 1))
        windows = -(-forward.presence.shape[1] // window)
        return ca.Occlusion(forward).attribute(
            forward.presence,
            sliding_window_shapes=(window,),
            strides=window,
            perturbations_per_eval=options.get("perturbations_per_eval", windows),
            **common,
        )
    explainer = ca.Lime(forward) if name == "lime" else ca.KernelShap(forward)
    samples = options.get("n_samples", 25)
    with _quiet_surrogate_fit():
        return explainer.attribute(
            forward.presence,
            n_samples=samples,
            perturbations_per_eval=options.get("perturbations_per_eval", samples),
            **common,
        )


def input_shaped(adapter: BackboneAdapter, inputs: FeatureInputs, values: torch.Tensor) -> torch.Tensor:
    """Feature values ``[B, d]`` per pixel ``[B, H, W]`` (image backbones with a feature grid), else as given."""
    grid = adapter.feature_grid(inputs)
    if grid is None or inputs.pixels is None:
        return values
    return upsample_mask(values.reshape(-1, *grid), (inputs.pixels.shape[-2], inputs.pixels.shape[-1]))
