"""bench/gpu_script.py's kernels step times the CUDA sparsemax kernels side by side (issue #46): the
thread-rows kernel and the warp-rows one, chosen by SOPFAST_CUDA_SPARSEMAX at each call, after checking
that they give the same bits."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_script.py"


@pytest.fixture
def gpu_script():
    spec = importlib.util.spec_from_file_location("gpu_script_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_seen(bits: dict[str, torch.Tensor]):
    """A stand-in for the CUDA sparsemax: the output of the kernel the variable names at call time."""
    return lambda: bits[os.environ.get("SOPFAST_CUDA_SPARSEMAX", "thread-rows")]


def test_both_kernels_are_timed_under_their_own_setting(gpu_script, monkeypatch):
    monkeypatch.delenv("SOPFAST_CUDA_SPARSEMAX", raising=False)
    same = torch.arange(4.0)
    impls = {"cuda": kernel_seen({"thread-rows": same, "warp-rows": same.clone()}), "triton": lambda: same}
    assert gpu_script.sparsemax_kernels_side_by_side(impls) == "warp-rows equals thread-rows bit for bit"
    assert set(impls) == {"cuda", "cuda warp-rows", "triton"}
    assert impls["cuda warp-rows"]() is not same and impls["cuda"]() is same
    assert "SOPFAST_CUDA_SPARSEMAX" not in os.environ  # restored after each call


def test_a_difference_is_reported_and_without_cuda_one_kernel_is_timed(gpu_script):
    impls = {"cuda": kernel_seen({"thread-rows": torch.zeros(2), "warp-rows": torch.tensor([0.0, 1e-30])})}
    assert "DIFFERS" in gpu_script.sparsemax_kernels_side_by_side(impls)
    triton_only = {"triton": lambda: torch.zeros(2)}
    assert gpu_script.sparsemax_kernels_side_by_side(triton_only).startswith("no CUDA kernels")
    assert set(triton_only) == {"triton"}
