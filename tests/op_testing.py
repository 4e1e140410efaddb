"""Backends, markers and helpers shared by the op tests (tests/test_ops_*.py).

Every native implementation of an op is tested against the PyTorch reference through one list,
:data:`NATIVE`, of ``(backend, device)`` pairs: the C++ CPU kernels, the CUDA C++ kernels (on a
GPU) and the Triton kernels (compiled on a GPU, else in Triton's interpreter on CPU tensors).
"""

from __future__ import annotations

import pytest
import torch

from sopfast.ops import _backends

needs_cpp = pytest.mark.skipif(not _backends.has_cpp(), reason="sopfast._C is not built")
needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and _backends.has_cuda_kernels()), reason="needs a GPU and the CUDA kernels"
)
# where the Triton kernels run: compiled on a GPU, else interpreted on CPU tensors (conftest sets TRITON_INTERPRET)
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    _backends.triton_kernels() is None, reason="needs Triton (a GPU, or TRITON_INTERPRET=1 with numpy)"
)
# (backend, device) of every native implementation
NATIVE = [
    pytest.param("cpp", "cpu", marks=needs_cpp, id="cpp"),
    pytest.param("cuda", "cuda", marks=needs_cuda, id="cuda"),
    pytest.param("triton", TRITON_DEVICE, marks=needs_triton, id="triton"),
]
# the same without Triton, for cases too large for its interpreter
NATIVE_COMPILED = NATIVE[:2] if TRITON_DEVICE == "cpu" else NATIVE


def native(op: str, backend: str):
    """The implementation of ``op`` (e.g. ``"sparsemax_forward"``) on ``backend``, called directly."""
    return _backends.OPS[op].implementation(backend)
