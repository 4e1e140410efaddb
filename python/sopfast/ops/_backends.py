"""Backend discovery, selection and the registry of the fused ops.

Every op (``"sparsemax_forward"``, ``"top_tau_backward"``, …) has up to four implementations,
found by one regular name (:data:`IMPLEMENTATIONS`, the one place that maps them):

* ``torch``  – the pure-PyTorch reference given to :class:`Op` (always available, the oracle),
* ``cpp``    – ``sopfast._C.<op>_cpu``, the C++ CPU kernel of the compiled extension,
* ``cuda``   – ``sopfast._C.<op>_cuda``, the CUDA C++ kernel (built only against a CUDA torch),
* ``triton`` – ``sop_kernels.<op>``, the Triton kernel (CUDA tensors, or the interpreter).

All four take the same arguments.  :func:`select_backend` picks one for a tensor: CUDA tensors →
``triton`` (else ``cuda``), CPU tensors → ``cpp``, anything else → ``torch``.
:func:`use_backend` (a context manager) or the environment variable
``SOPFAST_BACKEND=torch|cpp|triton|cuda`` overrides the choice, the context manager first (an
unavailable backend is an error, never a silent fallback).

Triton stays ahead of a built CUDA extension on CUDA tensors (decided in issue #24): the Triton
kernels cover every row length and ran on an H200 (``bench/RESULTS.md`` §3), while no GPU run of
the CUDA kernels is recorded yet — they are checked by nvcc and, through their per-row code
(``csrc/team_rows.h``), by host-thread tests against the CPU kernels.  Building them now costs about
a minute (one architecture), and ``SOPFAST_BACKEND=cuda`` selects them; the default should move to
``cuda`` once ``bench/gpu_report.py`` has passed on a GPU with them ahead in its timings.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from types import ModuleType
from typing import Any

import torch

BACKENDS = ("torch", "cpp", "triton", "cuda")
_warned = False
_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("sopfast_backend", default=None)


@cache
def native_extension() -> ModuleType | None:
    """The compiled ``sopfast._C`` module, or ``None`` when it is not built."""
    try:
        return importlib.import_module("sopfast._C")
    except ImportError:
        return None


def has_cpp() -> bool:
    return native_extension() is not None


def has_cuda_kernels() -> bool:
    ext = native_extension()
    return bool(ext is not None and getattr(ext, "has_cuda", lambda: False)())


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@cache
def triton_kernels() -> ModuleType | None:
    """The ``sop_kernels`` package when Triton can run (a GPU, or the interpreter)."""
    if not (torch.cuda.is_available() or _triton_interpreting()):
        return None
    try:
        return importlib.import_module("sop_kernels")
    except ImportError:
        return None


def available_backends() -> dict[str, bool]:
    """Which implementations can run on this machine."""
    return {
        "torch": True,
        "cpp": has_cpp(),
        "triton": triton_kernels() is not None,
        "cuda": has_cuda_kernels() and torch.cuda.is_available(),
    }


def _warn_missing_extension() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "sopfast: the compiled extension sopfast._C is not available; ops use their "
            "pure-PyTorch reference (slower). Build it with "
            "`pip install --no-build-isolation -e .`.",
            RuntimeWarning,
            stacklevel=3,
        )


def _check_backend_name(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{where}={name!r} is not a backend; allowed: {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the ops inside the ``with`` block on backend ``name`` (``"torch"``, ``"cpp"``, ``"triton"`` or
    ``"cuda"``), restoring the previous choice after; it wins over ``SOPFAST_BACKEND``.

    >>> with sopfast.ops.use_backend("torch"):
    ...     p = sopfast.ops.sparsemax(x)
    """
    token = _forced.set(_check_backend_name(name, "backend"))
    try:
        yield
    finally:
        _forced.reset(token)


def requested_backend() -> str | None:
    """The backend forced by :func:`use_backend` or ``SOPFAST_BACKEND``, if any (validated)."""
    forced = _forced.get()
    if forced is not None:
        return forced
    name = os.environ.get("SOPFAST_BACKEND", "").strip().lower()
    if not name:
        return None
    return _check_backend_name(name, "SOPFAST_BACKEND")


def select_backend(tensor: torch.Tensor) -> str:
    """The implementation to run for ``tensor`` (see module docstring)."""
    forced = requested_backend()
    if forced is not None:
        if not available_backends()[forced]:
            raise RuntimeError(
                f"backend {forced!r} was requested but is not available here "
                f"(available: {[k for k, v in available_backends().items() if v]})"
            )
        if (
            forced in ("triton", "cuda")
            and tensor.device.type != "cuda"
            and not (forced == "triton" and _triton_interpreting())
        ):
            raise RuntimeError(f"backend {forced!r} needs CUDA tensors, got {tensor.device}")
        if forced == "cpp" and tensor.device.type != "cpu":
            raise RuntimeError(f"backend 'cpp' needs CPU tensors, got {tensor.device}")
        return forced
    if tensor.device.type == "cuda":
        if triton_kernels() is not None:
            return "triton"
        if has_cuda_kernels():
            return "cuda"
        return "torch"
    if tensor.device.type == "cpu":
        if has_cpp():
            return "cpp"
        _warn_missing_extension()
    return "torch"


def backends() -> dict[str, object]:
    """What is active: available implementations and the choice for CPU / CUDA tensors."""
    avail = available_backends()
    cpu_choice = "cpp" if avail["cpp"] else "torch"
    cuda_choice = "triton" if avail["triton"] and torch.cuda.is_available() else ("cuda" if avail["cuda"] else "torch")
    forced = requested_backend()
    return {
        "available": avail,
        "cpu": forced or cpu_choice,
        "cuda": forced or cuda_choice,
        "forced": forced,
    }


# backend -> op name -> that backend's implementation of the op (the native modules load lazily)
IMPLEMENTATIONS: dict[str, Callable[[str], Callable[..., Any]]] = {
    "cpp": lambda op: getattr(native_extension(), f"{op}_cpu"),
    "cuda": lambda op: getattr(native_extension(), f"{op}_cuda"),
    "triton": lambda op: getattr(triton_kernels(), op),
}


class Op:
    """One op's implementations, by backend: ``reference`` for ``torch``, the others by name
    (:data:`IMPLEMENTATIONS`).  Calling it runs the backend :func:`select_backend` picks for the
    first argument."""

    def __init__(self, name: str, reference: Callable[..., Any]) -> None:
        if name in OPS:
            raise ValueError(f"op {name!r} is already registered")
        self.name = name
        self.reference = reference
        OPS[name] = self

    def implementation(self, backend: str) -> Callable[..., Any]:
        """The implementation on ``backend`` (one of :data:`BACKENDS`)."""
        if backend == "torch":
            return self.reference
        if backend not in IMPLEMENTATIONS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        return IMPLEMENTATIONS[backend](self.name)

    def __call__(self, *args: Any) -> Any:
        return self.implementation(select_backend(args[0]))(*args)


# every registered op by name
OPS: dict[str, Op] = {}
