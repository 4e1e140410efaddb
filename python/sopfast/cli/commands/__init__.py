"""One module per ``sopfast`` subcommand, each with ``add_arguments(parser)`` and ``run(args) -> int``.

:data:`COMMANDS` names them, with their one-line help, in the order ``sopfast --help`` shows; :func:`load`
imports one (torch and the rest of sopfast are imported only then: ``sopfast --version`` needs none).
"""

from __future__ import annotations

import importlib
from types import ModuleType

COMMANDS = {
    "demo": "End-to-end run on offline data: train a backbone, train SOP, evaluate, draw.",
    "diagnose": "Measure a backbone on whole inputs and on random groups of its features (what SOP can reach).",
    "adapt": "Adapt a copy of a backbone to masked inputs (SOP's groups), saved as a separate backbone.",
    "train": "Train a SOP model over a backbone on a built-in dataset or your own data.",
    "evaluate": "Evaluate a trained SOP model (accuracy, fidelity, insertion, deletion …).",
    "explain": "Write explanation pictures (PNG per image, HTML per text).",
    "predict": "Write every example's prediction, groups and scores (or an explainer's attributions) as Parquet.",
    "bench": "Reference vs exact vs drop, side by side, on random weights.",
    "convert": "Convert an authors' SOP checkpoint (exlib SOPImageCls) to sopfast's format.",
    "theory": "Lower bounds on per-feature SANN error vs the group construction.",
}


def load(name: str) -> ModuleType:
    """The module of subcommand ``name`` (a key of :data:`COMMANDS`)."""
    return importlib.import_module(f"{__name__}.{name}")


__all__ = ["COMMANDS", "load"]
