"""Markers and helpers shared by the op tests (tests/test_ops_*.py)."""

from __future__ import annotations

import pytest
import torch

from sopfast.ops import _backends

needs_cpp = pytest.mark.skipif(not _backends.has_cpp(), reason="sopfast._C is not built")
needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and _backends.has_cuda_kernels()), reason="needs a GPU and the CUDA kernels"
)
# (backend, device) pairs of the native kernels
NATIVE = [pytest.param("cpp", "cpu", marks=needs_cpp), pytest.param("cuda", "cuda", marks=needs_cuda)]
