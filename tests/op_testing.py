"""Backends, markers and helpers shared by the op tests (tests/test_ops_*.py).

Every native implementation of an op is tested against the PyTorch reference through one list,
:data:`NATIVE`, of ``(backend, device)`` pairs: the C++ CPU kernels, the CUDA C++ kernels (on a
GPU) and the Triton kernels (compiled on a GPU, else in Triton's interpreter on CPU tensors).
Large parameter grids go through :func:`native_params`: the whole grid on every compiled backend,
a covering subset of it (:func:`covering`) in Triton's interpreter.
"""

from __future__ import annotations

import itertools

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
# Triton runs in its interpreter (numpy, one program at a time): many times slower than the compiled kernels
INTERPRETED = TRITON_DEVICE == "cpu"
# the same without Triton, for cases too large for its interpreter
NATIVE_COMPILED = NATIVE[:2] if INTERPRETED else NATIVE


def native(op: str, backend: str):
    """The implementation of ``op`` (e.g. ``"sparsemax_forward"``) on ``backend``, called directly."""
    return _backends.OPS[op].implementation(backend)


def every_case(factors: dict[str, list]) -> list[dict]:
    """The product of ``factors``: every ``{factor: value}``, in order."""
    return [dict(zip(factors, values, strict=True)) for values in itertools.product(*factors.values())]


def covering(factors: dict[str, list], crossed: tuple[str, ...] = ()) -> list[dict]:
    """Cases (``{factor: value}``) from the product of ``factors`` in which every pair of values of two
    factors occurs at least once; the ``crossed`` factors count as one, so every combination of their
    values occurs (and meets every value of every other factor).  Greedy and deterministic: each step
    takes the first case of the product that covers the most pairs not yet covered."""
    groups = [crossed] if crossed else []
    groups += [(name,) for name in factors if name not in crossed]
    cases = every_case(factors)

    def pairs(case: dict) -> set:
        keys = [tuple(case[name] for name in group) for group in groups]
        return {(i, keys[i], j, keys[j]) for i, j in itertools.combinations(range(len(groups)), 2)}

    uncovered = set().union(*(pairs(case) for case in cases))
    chosen = []
    while uncovered:
        best = max(cases, key=lambda case: len(pairs(case) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def native_params(factors: dict[str, list], crossed: tuple[str, ...] = ()) -> list:
    """``pytest.param(backend, device, *values)`` for a test parametrized ``("backend", "device",
    *factors)``: the whole product of ``factors`` on every compiled backend, only :func:`covering`
    ``(factors, crossed)`` in Triton's interpreter (its kernels run in numpy, one program at a time;
    the compiled backends check every combination against the same reference)."""
    full = every_case(factors)
    params = []
    for backend in NATIVE:
        name, device = backend.values
        cases = covering(factors, crossed) if name == "triton" and INTERPRETED else full
        params += [
            pytest.param(name, device, *case.values(), marks=backend.marks, id=_case_id(name, case)) for case in cases
        ]
    return params


def _case_id(backend: str, case: dict) -> str:
    values = [
        str(value).removeprefix("torch.") if not isinstance(value, bool) else f"{name}={value}"
        for name, value in case.items()
    ]
    return "-".join([*values, backend])
