"""Explainers over a dataset (:data:`sopfast.masking.EXPLAINERS`, the one registry), on sopfast's masked
inference (:mod:`sopfast.masking`).

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
from ..masking.explainers import EXPLAINERS, get_explainer
from ..types import FeatureInputs


def check_explainer(name: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` checked against explainer ``name``'s (:meth:`sopfast.masking.Explainer.check_options`);
    ValueError naming what is allowed."""
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"explainer_options must be a dict of option → value, got {type(options).__name__}")
    if name is None:
        if options:
            raise ValueError(
                f"explainer_options {sorted(options)} given without an explainer; allowed: {tuple(EXPLAINERS)}"
            )
        return {}
    return get_explainer(name, " or None").check_options(options)


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
    explainer = get_explainer(name)
    rows = [
        explainer(adapter, inputs.rows(slice(i, i + 1)), target[i : i + 1], mode=mode, seed=seed, **options)
        for i in range(inputs.batch_size)
    ]
    return torch.cat(rows).float()


def input_shaped(adapter: BackboneAdapter, inputs: FeatureInputs, values: torch.Tensor) -> torch.Tensor:
    """Feature values ``[B, d]`` per pixel ``[B, H, W]`` (image backbones with a feature grid), else as given."""
    grid = adapter.feature_grid(inputs)
    if grid is None or inputs.pixels is None:
        return values
    return upsample_mask(values.reshape(-1, *grid), (inputs.pixels.shape[-2], inputs.pixels.shape[-1]))
