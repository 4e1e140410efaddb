"""The architecture's promises: the layers (``docs/contributing.md``), no import cycle inside a room and the
native kernels importing nothing of the package above them; every API option is a flag; a metric is one
registered function; an adapter registers itself; no module of the package is over 500 lines."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest
import torch

import sopfast
from sopfast.cli import build_parser
from sopfast.cli.options import parameters
from sopfast.evaluation.registry import REGISTRY, Metric, register_metric
from sopfast.training import TrainConfig

PACKAGE = Path(sopfast.__file__).parent
KERNELS = PACKAGE.parent.parent / "sop_kernels"
# docs/contributing.md: the layers, bottom (1) to top (7), by top-level module or package
LAYERS = {
    "checks": 1,
    "defaults": 1,
    "devices": 1,
    "integrity": 1,
    "types": 1,
    "testing": 1,
    "version": 1,
    "_C": 1,
    "schedules": 1,
    "ops": 2,
    "theory": 2,
    "adapters": 3,
    "model": 4,
    "data": 4,
    "masking": 5,
    "training": 6,
    "evaluation": 6,
    "explain": 6,
    "benchmark": 6,
    "demo": 7,
    "prediction": 7,
    "cli": 8,
}


def _imports(path: Path) -> set[str]:
    """The top-level sopfast modules ``path`` imports (relative or absolute, lazy imports included)."""
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    package = parts[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - (node.level - 1)])
                target = base + (node.module.split(".") if node.module else [])
                names = [target] if target else [[alias.name] for alias in node.names]
            elif node.module and node.module.split(".")[0] == "sopfast":
                target = node.module.split(".")[1:]
                names = [target] if target else [[alias.name] for alias in node.names]
            else:
                continue
            found |= {n[0] for n in names if n}
    return found


def test_modules_import_only_their_own_package_and_lower_layers():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        for target in _imports(path) - {own}:
            if LAYERS[target] >= LAYERS[own]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert not wrong, wrong


def _module(path: Path, root: Path) -> str:
    """``path``'s dotted module name under ``root``'s parent (a package ``__init__`` is the package)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, root: Path) -> set[str]:
    """Every dotted module (or module.name) ``path`` imports, relative imports resolved, lazy and
    type-checking imports included."""
    package = _module(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def _cycles(root: Path) -> list[list[str]]:
    """The import cycles among the modules of ``root`` (a package ``__init__``, which imports its modules to
    hand on their names, is no part of one): each strongly connected group of two modules or more."""
    paths = {_module(p, root): p for p in root.rglob("*.py")}
    modules = {name for name, p in paths.items() if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        targets = set()
        for imported in _module_imports(paths[name], root):
            while imported and imported not in paths:
                imported = imported.rpartition(".")[0]
            if imported in modules and imported != name:
                targets.add(imported)
        graph[name] = targets

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reachable = {name: reach(name) for name in graph}
    groups = {frozenset({n} | {m for m in reachable[n] if n in reachable[m]}) for n in graph if n in reachable[n]}
    return sorted(sorted(group) for group in groups)


def test_no_import_cycle_inside_a_room():
    """A room's modules import each other one way (type-only imports count: they name what a module needs)."""
    assert _cycles(PACKAGE) == []
    assert _cycles(KERNELS) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    room = tmp_path / "room"
    room.mkdir()
    (room / "__init__.py").write_text("from .a import A\n")
    (room / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (room / "b.py").write_text("from . import a\n")
    (room / "c.py").write_text("from .a import A\n")
    assert _cycles(room) == [["room.a", "room.b"]]


def test_native_kernels_import_nothing_of_the_package():
    """``sop_kernels`` sits below sopfast (``ops/_backends.py`` loads it and hands it what it needs)."""
    upward = [
        f"{path.name} imports {name}"
        for path in KERNELS.rglob("*.py")
        for name in _module_imports(path, KERNELS)
        if name.split(".")[0] == "sopfast"
    ]
    assert KERNELS.is_dir() and not upward, upward


def flags(command: str) -> set[str]:
    parser = build_parser().subcommands[command]
    return {a.dest for a in parser._actions if a.option_strings}


def test_train_has_a_flag_for_every_sop_and_training_option():
    have = flags("train")
    sop_options = set(parameters(sopfast.SOP)) - {"class_weights"}
    cnn_options = set(parameters(sopfast.adapters.CNNAdapter)) - {"backbone"}
    assert sop_options | cnn_options <= have, sorted((sop_options | cnn_options) - have)
    assert set(parameters(TrainConfig)) <= have, sorted(set(parameters(TrainConfig)) - have)


def test_evaluate_has_a_flag_for_every_keyword_of_evaluate():
    assert set(parameters(sopfast.evaluate)) - {"print_table"} <= flags("evaluate")


def test_a_flag_means_the_same_on_every_command():
    """``--mode``, ``--tau``, ``--device``, ``--seed``, ``--num-groups`` have one meaning and type."""
    parser = build_parser()
    seen: dict[str, tuple] = {}
    for name, sub in parser.subcommands.items():
        for action in sub._actions:
            if action.dest in ("mode", "tau", "num_groups", "device", "seed") and name != "bench":
                key = (action.dest, action.choices and tuple(action.choices), getattr(action.type, "__name__", None))
                seen.setdefault(action.dest, key)
                assert seen[action.dest] == key, (name, action.dest)


def test_a_new_metric_is_one_registered_function(monkeypatch):
    metric = Metric(
        "mean_lambda_sign",
        collect=lambda step: {"mean_lambda_sign": step.base.logits.sign().mean(dim=1)},
        finalize=lambda kept, plan, model: {"mean_lambda_sign": float(kept["mean_lambda_sign"].mean())},
    )
    monkeypatch.setitem(REGISTRY, metric.name, metric)
    model = sopfast.SOP(sopfast.testing.make_hf_vit(), num_groups=3, tau=0.25)
    results = sopfast.evaluate(model, [torch.randn(2, 3, 32, 32)], metrics=["mean_lambda_sign"], progress=False)
    assert set(results["SOP"]) == {"examples", "mean_lambda_sign"}


def test_registering_a_metric_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_metric(REGISTRY["accuracy"])


def test_no_module_is_over_500_lines():
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert not {name: n for name, n in lines.items() if n > 500}


def test_help_lists_the_options_in_words():
    text = build_parser().subcommands["train"].format_help()
    assert "--center-embeddings" in text and "--feature-layer" in text and "--warmup-ratio" in text
    assert "``" not in text


def test_namespace_of_unset_model_flags_leaves_api_defaults():
    args = build_parser().subcommands["train"].parse_args(["--backbone", "x"])
    assert not hasattr(args, "tau") and isinstance(args, argparse.Namespace)
