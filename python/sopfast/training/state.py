"""Reproducibility and records of a training run: seeding, RNG states for an exact resume, the
JSON-lines log."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """The python/numpy/torch(/CUDA) RNG states, as plain types ``torch.load(weights_only=True)`` accepts."""
    numpy_state = np.random.get_state()
    if not isinstance(numpy_state, tuple):  # the legacy form: a tuple for the global MT19937 generator
        raise TypeError(f"numpy's global random state is not MT19937's tuple: {type(numpy_state).__name__}")
    kind, keys, pos, has_gauss, cached = numpy_state
    return {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
