"""The build's CUDA decision (setup.py ``_cuda_wanted``, used by scripts/setup.sh): the CUDA kernels
are compiled on a machine that can run them, and never by default on one without a GPU (they take
minutes to compile)."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cuda_wanted():
    """``_cuda_wanted`` from setup.py, without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "_cuda_wanted")
    namespace = {"os": os, "shutil": __import__("shutil"), "sys": __import__("sys")}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace["_cuda_wanted"]


def fake_torch(cuda_build: bool, gpu: bool):
    return SimpleNamespace(
        version=SimpleNamespace(cuda="13.0" if cuda_build else None), cuda=SimpleNamespace(is_available=lambda: gpu)
    )


@pytest.mark.parametrize(
    ("flag", "cuda_build", "nvcc", "gpu", "expected"),
    [
        ("auto", True, True, True, True),
        ("auto", True, True, False, False),  # a CPU machine with a CUDA torch and nvcc: stays fast
        ("auto", True, False, True, False),
        ("auto", False, True, True, False),
        ("1", True, True, False, True),  # forced: compile-check the CUDA sources without a GPU
        ("0", True, True, True, False),
    ],
)
def test_cuda_kernels_build_where_they_can_run(monkeypatch, flag, cuda_build, nvcc, gpu, expected):
    import shutil

    monkeypatch.setenv("SOPFAST_BUILD_CUDA", flag)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvcc" if nvcc else None)
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    assert cuda_wanted()(fake_torch(cuda_build, gpu)) is expected


def test_forcing_without_nvcc_or_a_bad_flag_stops_the_build(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    monkeypatch.setenv("SOPFAST_BUILD_CUDA", "1")
    with pytest.raises(SystemExit, match="nvcc is missing"):
        cuda_wanted()(fake_torch(True, True))
    monkeypatch.setenv("SOPFAST_BUILD_CUDA", "maybe")
    with pytest.raises(SystemExit, match="auto, 1 or 0"):
        cuda_wanted()(fake_torch(True, True))


def test_setup_script_builds_cuda_automatically():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'SOPFAST_BUILD_CUDA="${SOPFAST_BUILD_CUDA:-auto}"' in script
