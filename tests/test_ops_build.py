"""The build's CUDA decisions (setup.py ``_cuda_wanted`` and ``_cuda_arch_flags``, used by
scripts/setup.sh): the CUDA kernels are compiled on a machine that can run them, never by default on
one without a GPU, and for one architecture unless ``TORCH_CUDA_ARCH_LIST`` asks for more."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def from_setup_py(name: str):
    """The function ``name`` of setup.py, without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)
    namespace = {"os": os, "shutil": __import__("shutil"), "sys": __import__("sys")}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace[name]


def cuda_wanted():
    return from_setup_py("_cuda_wanted")


def fake_torch(cuda_build: bool, gpu: bool, capabilities: tuple[tuple[int, int], ...] = ((9, 0),)):
    cuda = SimpleNamespace(
        is_available=lambda: gpu,
        device_count=lambda: len(capabilities) if gpu else 0,
        get_device_capability=lambda i: capabilities[i],
    )
    return SimpleNamespace(version=SimpleNamespace(cuda="13.0" if cuda_build else None), cuda=cuda)


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


@pytest.mark.parametrize(
    ("arch_list", "gpu", "capabilities", "expected"),
    [
        ("", True, ((8, 0),), ["-gencode=arch=compute_80,code=sm_80"]),  # the visible GPU's
        ("", True, ((9, 0), (9, 0)), ["-gencode=arch=compute_90,code=sm_90"]),
        ("", False, (), ["-gencode=arch=compute_90,code=sm_90"]),  # SOPFAST_BUILD_CUDA=1 without a GPU
        ("8.0;9.0", True, ((9, 0),), []),  # torch's cpp_extension adds the listed ones
    ],
)
def test_cuda_kernels_compile_for_one_architecture(monkeypatch, arch_list, gpu, capabilities, expected):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    assert from_setup_py("_cuda_arch_flags")(fake_torch(True, gpu, capabilities)) == expected
