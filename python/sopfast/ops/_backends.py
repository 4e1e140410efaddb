"""The fused ops in PyTorch's dispatcher, and the backends that implement them.

Every op — ``sparsemax``, ``top_tau``, ``gather_tokens`` and their ``*_backward``, and the composites
``group_select`` and ``aggregate`` — is ``torch.ops.sopfast.<op>``, callable from Python, C++ or a
compiled graph.  :class:`Op` declares a fused op's schema once; its kernels are registered per
dispatch key, and the dispatcher chooses:

* ``CPU`` — the C++ kernel of the compiled extension (``csrc/registration.cpp``);
* ``CUDA`` — the CUDA C++ kernel of a CUDA build of the extension (``csrc/registration.cpp``), else
  the Triton kernel (``sop_kernels``) when Triton can run on a GPU, else the reference;
* ``Autograd`` — once for every device, in C++ (``csrc/autograd.cpp``);
* ``Meta`` and fake tensors — the output shapes (``torch.compile``, meta tensors);
* any other device — the pure-PyTorch reference (``CompositeExplicitAutograd``).

Without the extension (``SOPFAST_NO_EXTENSION=1``) every op is its differentiable reference
(``CompositeImplicitAutograd``), with one warning.

Each op has up to four implementations, found by one regular name (:meth:`Op.implementation`):
``torch`` (the reference, the oracle), ``cpp`` (``sopfast._C.<kernel>_cpu``), ``cuda``
(``sopfast._C.<kernel>_cuda``) and ``triton`` (``sop_kernels.<kernel>``, on CUDA tensors or in
Triton's interpreter), where ``<kernel>`` is ``<op>_forward`` or ``<op>_backward``.

For tests and benchmarks, :func:`use_backend` (a context manager) or the environment variable
``SOPFAST_BACKEND=torch|cpp|triton|cuda`` registers one backend's implementations for CPU and CUDA
tensors on top of the defaults while it holds — process-wide, the context manager over the variable;
an unavailable backend is an error, never a silent fallback.  The variable is read when ``sopfast``
is imported and again by :func:`use_backend`, :func:`backends`, :func:`select_backend` and
:func:`sync_environment` (the public ops do not read it: a call costs a few µs).

A CUDA build of the extension goes ahead of Triton on CUDA tensors (issue #29, an H200 on 2026-11-27,
torch 2.11, triton 3.6: Triton failed to compile top_tau for rows of 49 to 1,024 features, ViT's 196
among them, while every CUDA op check passed and CUDA's sparsemax ran 1.5× Triton's; bench/RESULTS_gpu.md).
``SOPFAST_BACKEND=triton`` selects the Triton kernels.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from types import ModuleType
from typing import Any

import torch

BACKENDS = ("torch", "cpp", "triton", "cuda")
NAMESPACE = "sopfast"


def _load_extension() -> ModuleType | None:
    try:
        return importlib.import_module("sopfast._C")
    except ImportError:
        return None


# loaded with the package: importing it registers the C++ kernels and the autograd
_EXTENSION = _load_extension()


def native_extension() -> ModuleType | None:
    """The compiled ``sopfast._C`` module, or ``None`` when it is not built."""
    return _EXTENSION


def has_cpp() -> bool:
    return _EXTENSION is not None


def has_cuda_kernels() -> bool:
    return bool(_EXTENSION is not None and _EXTENSION.has_cuda())


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
    """Which implementations can run on this machine (the native ones need the extension, which holds
    the autograd)."""
    return {
        "torch": True,
        "cpp": has_cpp(),
        "triton": has_cpp() and triton_kernels() is not None,
        "cuda": has_cuda_kernels() and torch.cuda.is_available(),
    }


def default_backend(device_type: str) -> str:
    """The implementation the dispatcher runs for tensors of ``device_type`` without an override."""
    if not has_cpp():
        return "torch"
    if device_type == "cpu":
        return "cpp"
    if device_type == "cuda":
        if has_cuda_kernels():
            return "cuda"
        return "triton" if torch.cuda.is_available() and triton_kernels() is not None else "torch"
    return "torch"


def _runs_on(backend: str, device_type: str) -> bool:
    if backend == "torch":
        return True
    if backend == "triton":
        return device_type == "cuda" or _triton_interpreting()
    return device_type == ("cpu" if backend == "cpp" else "cuda")


class Op:
    """One op of ``torch.ops.sopfast``: declares ``name`` + ``schema`` and registers its kernels.

    ``reference`` is the pure-PyTorch implementation (the oracle and the ``torch`` backend), ``fake``
    gives the output shapes, ``kernel`` names the native implementations (which apply the rule for rows
    without a result themselves).  Every kernel runs the op's argument checks first, the ones in C++
    (``csrc/op_checks.h``): the C++ kernels call them, and each kernel registered from Python (the
    reference, Triton, the fake) goes through ``sopfast._C.check_<kernel>`` (:meth:`checked`; the fake
    without the checks that read values)."""

    def __init__(
        self,
        name: str,
        schema: str,
        kernel: str,
        reference: Callable[..., Any],
        fake: Callable[..., Any],
    ) -> None:
        if kernel in OPS:
            raise ValueError(f"op {kernel!r} is already registered")
        self.name, self.kernel, self.reference = name, kernel, reference
        LIBRARY.define(name + schema)
        if has_cpp():
            # the fake first: it also becomes the Meta kernel, which the reference would otherwise fill
            torch.library.register_fake(f"{NAMESPACE}::{name}", self.checked(fake, values=False), lib=LIBRARY)
            LIBRARY.impl(name, self.checked(reference), "CompositeExplicitAutograd")
            if default_backend("cuda") == "triton":
                LIBRARY.impl(name, self.checked(self.implementation("triton")), "CUDA")
        else:
            LIBRARY.impl(name, reference, "CompositeImplicitAutograd")
        self.overload = getattr(getattr(torch.ops, NAMESPACE), name).default
        OPS[kernel] = self

    def implementation(self, backend: str) -> Callable[..., Any]:
        """The implementation on ``backend`` (one of :data:`BACKENDS`), called directly."""
        if backend == "torch":
            return self.reference
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "triton":
            kernels = triton_kernels()
            if kernels is None:
                raise RuntimeError("backend 'triton' is not available here (it needs a GPU or TRITON_INTERPRET=1)")
            return getattr(kernels, self.kernel)
        if _EXTENSION is None or (backend == "cuda" and not has_cuda_kernels()):
            raise RuntimeError(f"backend {backend!r} is not available here (sopfast._C is not built with it)")
        return getattr(_EXTENSION, f"{self.kernel}_{'cpu' if backend == 'cpp' else 'cuda'}")

    def checked(self, implementation: Callable[..., Any], values: bool = True) -> Callable[..., Any]:
        """``implementation`` behind the op's C++ argument checks (``sopfast._C.check_<kernel>``); without
        ``values`` the checks read no tensor values (for the fake, whose tensors hold none)."""
        check = getattr(_EXTENSION, f"check_{self.kernel}")

        def run(*args: Any) -> Any:
            check(*args, values=values)
            return implementation(*args)

        return run

    def kernel_on(self, backend: str, device_type: str) -> Callable[..., Any]:
        """What an override of ``backend`` registers for ``device_type``: the implementation (behind the
        checks where it is Python), or an error."""
        if _runs_on(backend, device_type):
            implementation = self.implementation(backend)
            return self.checked(implementation) if backend in ("torch", "triton") else implementation

        def refuse(*args: Any) -> Any:
            needs = "CUDA" if backend in ("cuda", "triton") else "CPU"
            raise RuntimeError(f"backend {backend!r} needs {needs} tensors, got {device_type} tensors")

        return refuse


def composite(name: str, schema: str, function: Callable[..., Any]) -> Any:
    """Declares ``torch.ops.sopfast.<name>``, an op written in torch ops (and the ops above): one Python
    implementation for every device, differentiated through (``CompositeImplicitAutograd``); returns its
    overload."""
    LIBRARY.define(name + schema)
    LIBRARY.impl(name, function, "CompositeImplicitAutograd")
    return getattr(getattr(torch.ops, NAMESPACE), name).default


# the schemas of every op
LIBRARY = torch.library.Library(NAMESPACE, "DEF")
# every op by kernel name (sparsemax_forward, ...)
OPS: dict[str, Op] = {}


# ----------------------------------------------------------------------------- overrides


def _check_backend_name(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{where}={name!r} is not a backend; allowed: {', '.join(BACKENDS)}")
    return name


def _check_available(name: str) -> None:
    available = available_backends()
    if not available[name]:
        raise RuntimeError(
            f"backend {name!r} was requested but is not available here "
            f"(available: {[k for k, v in available.items() if v]})"
        )


# torch < 2.14 refuses a second Python kernel for one (op, dispatch key) unless told it may override
_IMPL_PARAMETERS = inspect.signature(torch.library.Library.impl).parameters
_OVERRIDE = {"allow_override": True} if "allow_override" in _IMPL_PARAMETERS else {}


def _register(name: str, over_defaults: bool) -> torch.library.Library | None:
    """Registers backend ``name``'s implementations for CPU and CUDA tensors; where it is the default
    and nothing else is registered (``over_defaults`` False), the default kernel stays."""
    if not has_cpp():
        return None  # the references are all there is
    library = torch.library.Library(NAMESPACE, "IMPL")
    for device_type in ("cpu", "cuda"):
        if over_defaults or name != default_backend(device_type):
            for op in OPS.values():
                library.impl(op.name, op.kernel_on(name, device_type), device_type.upper(), **_OVERRIDE)
    return library


class _Overrides:
    """The registered overrides: ``SOPFAST_BACKEND`` at the bottom, the open :func:`use_backend` blocks
    above it, innermost on top."""

    def __init__(self) -> None:
        self.environment_value: str | None = None  # the variable as last applied (raw)
        self.environment: str | None = None
        self.stack: list[str] = []
        self.libraries: list[torch.library.Library | None] = []

    def rebuild(self) -> None:
        for library in self.libraries:
            if library is not None:
                library._destroy()
        names = ([self.environment] if self.environment else []) + self.stack
        self.libraries = [_register(name, over_defaults=i > 0) for i, name in enumerate(names)]


_overrides = _Overrides()
_warned = False


def sync_environment() -> None:
    """Applies ``SOPFAST_BACKEND`` when it changed since it was last read."""
    value = os.environ.get("SOPFAST_BACKEND", "")
    if value == _overrides.environment_value:
        return
    name = value.strip().lower() or None
    if name is not None:
        _check_backend_name(name, "SOPFAST_BACKEND")
        _check_available(name)
    _overrides.environment_value, _overrides.environment = value, name
    _overrides.rebuild()


def check_extension() -> None:
    """At every call of a public op: one warning, the first time, when the ops run their references for
    want of the extension (cheap otherwise)."""
    global _warned
    if _EXTENSION is None and not _warned:
        _warned = True
        warnings.warn(
            "sopfast: the compiled extension sopfast._C is not available; ops use their "
            "pure-PyTorch reference (slower). Build it with "
            "`pip install --no-build-isolation -e .`.",
            RuntimeWarning,
            stacklevel=3,
        )


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the ops on backend ``name`` (``"torch"``, ``"cpp"``, ``"triton"`` or ``"cuda"``) while the
    ``with`` block is open (process-wide), restoring the previous choice after; it wins over
    ``SOPFAST_BACKEND``.

    >>> with sopfast.ops.use_backend("torch"):
    ...     p = sopfast.ops.sparsemax(x)
    """
    _check_backend_name(name, "backend")
    _check_available(name)
    sync_environment()
    _overrides.stack.append(name)
    _overrides.rebuild()
    try:
        yield
    finally:
        _overrides.stack.pop()
        _overrides.rebuild()


def defaults_hold() -> bool:
    """Whether the default kernels run (no override; the extension built): cheap, for the public ops."""
    return _EXTENSION is not None and not _overrides.stack and _overrides.environment is None


def requested_backend() -> str | None:
    """The backend forced by :func:`use_backend` or ``SOPFAST_BACKEND``, if any (validated)."""
    sync_environment()
    if _overrides.stack:
        return _overrides.stack[-1]
    return _overrides.environment


def select_backend(tensor: torch.Tensor) -> str:
    """The implementation the dispatcher runs for ``tensor``: the override, else the device's default."""
    forced = requested_backend()
    if forced is None:
        return default_backend(tensor.device.type)
    if not _runs_on(forced, tensor.device.type):
        needs = "CPU" if forced == "cpp" else "CUDA"
        raise RuntimeError(f"backend {forced!r} needs {needs} tensors, got {tensor.device}")
    return forced


def backends() -> dict[str, object]:
    """What is active: available implementations and what runs for CPU / CUDA tensors."""
    forced = requested_backend()
    return {
        "available": available_backends(),
        "cpu": forced or default_backend("cpu"),
        "cuda": forced or default_backend("cuda"),
        "forced": forced,
    }
