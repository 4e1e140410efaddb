"""``sopfast check-adapter``: whether a backbone's adapter computes what the backbone computes
(:func:`sopfast.adapters.check`): the full forward, the classifier and feature shapes, the generator
embedding, the group passes in ``exact`` and a ``drop = exact`` claim, one line each.  Exit status 0 when
every comparison passes, 1 when one fails.

``--import MODULE`` imports your module first (where it calls ``sopfast.adapters.register_adapter``), so
the adapter you registered is the one checked (or the one ``--adapter NAME`` names).  Without ``--data``
the examples are random inputs of the backbone's shape (images of its size, texts of random token ids)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from ..common import add_common, add_data, add_model_source, load_adapter_split, load_backbone, load_model
from ..options import flag
from ..parser import CLIError, int_at_least, positive_float
from .train import adapter_flags, adapter_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_model_source(p, need_checkpoint=False)
    add_data(p)
    g = p.add_argument_group("check (sopfast.adapters.check)")
    g.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=None,
        metavar="MODULE",
        help="import this Python module first (the working directory is searched), e.g. the one that registers "
        "your adapter (repeatable)",
    )
    g.add_argument("--adapter", default=None, help="check the adapter of this name (default: the backbone's)")
    g.add_argument(
        "--examples", type=int_at_least(1), default=2, help="examples to check on (default: 2; the first of --data)"
    )
    g.add_argument(
        "--tolerance",
        type=positive_float,
        default=None,
        help="allowed difference, times the spread of the expected values (default: 1e-4; 1e-2 in half precision)",
    )
    p.set_defaults(adapter_names=adapter_flags(g))


def _adapter(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any] | None]:
    """``(backbone, adapter, what a model recorded)``: ``--backbone`` with the adapter ``--adapter`` names (or
    the one it matches) and the adapter flags, or the ``--checkpoint`` model's."""
    from ...adapters import adapter_class, find_adapter_class

    if args.checkpoint is not None:
        given = [flag(n) for n in ["adapter", *args.adapter_names] if getattr(args, n, None) is not None]
        if given:
            raise CLIError(f"{given[0]}: the adapter comes from --checkpoint {args.checkpoint}")
        backbone = load_backbone(args)
        model = load_model(args, backbone, {})
        return backbone, model.adapter, model.provenance
    if args.backbone is None:
        raise CLIError("give --backbone (the backbone whose adapter to check) or --checkpoint (a saved model)")
    backbone = load_backbone(args)
    adapter_cls = adapter_class(args.adapter) if args.adapter else find_adapter_class(backbone.model)
    options = adapter_options(args, backbone, args.adapter_names, adapter_cls)
    return backbone, adapter_cls(backbone.model, **options), None


def _examples(args: argparse.Namespace, backbone: Any, adapter: Any, saved: dict[str, Any] | None) -> Any:
    """The first ``--examples`` of ``--data`` (its validation split), or random ones."""
    from ...adapters.conformance import example_inputs
    from ...data.batches import parse_batch

    if args.data is None:
        return example_inputs(adapter, args.examples, args.seed)
    dataset = load_adapter_split(args, adapter, backbone, "val", args.examples, saved).dataset
    batch = parse_batch(next(iter(_loader(dataset, args.examples))))
    return adapter.prepare(**batch.adapter_inputs())


def _loader(dataset: Any, examples: int) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=examples)


def run(args: argparse.Namespace) -> int:
    from ...adapters import check

    if args.imports and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module of yours beside you, as `python -c "import it"` finds it
    for module in args.imports or []:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise CLIError(f"--import {module}: {err}") from err
    backbone, adapter, saved = _adapter(args)
    report = check(adapter, _examples(args, backbone, adapter, saved), tolerance=args.tolerance)
    print(report)
    return 0 if report.ok else 1
