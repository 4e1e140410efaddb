"""Argument checks shared by every part of sopfast.

Each check names the argument, the value and what is allowed.  One exception type per kind of
mistake: a value of the wrong **type** raises ``TypeError``; a value of the right type that is
**not allowed** (out of range, not a choice, wrong shape) raises ``ValueError``.
"""

from __future__ import annotations

import argparse
import math
import numbers
import operator
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, SupportsIndex, TypeVar, cast

import torch

T = TypeVar("T")


def _bounds(minimum: float | None, maximum: float | None, optional: bool) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"≥ {minimum}")
    if maximum is not None:
        parts.append(f"≤ {maximum}")
    text = " and ".join(parts)
    return (f" {text}" if text else "") + (" or None" if optional else "")


def check_int(
    name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *, optional: bool = False
) -> Any:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (``None`` passes when ``optional``)."""
    if value is None and optional:
        return None
    allowed = f"an integer{_bounds(minimum, maximum, optional)}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_number(
    name: str,
    value: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    above: bool = False,
    optional: bool = False,
) -> Any:
    """``value`` as a finite ``float`` in ``[minimum, maximum]`` (``(minimum, …]`` with ``above``)."""
    if value is None and optional:
        return None
    low = "" if minimum is None else (f"> {minimum}" if above else f"≥ {minimum}")
    high = "" if maximum is None else f"≤ {maximum}"
    allowed = "a finite number" + (f" {' and '.join(p for p in (low, high) if p)}" if low or high else "")
    allowed += " or None" if optional else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    value = float(value)
    too_low = minimum is not None and (value <= minimum if above else value < minimum)
    if not math.isfinite(value) or too_low or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


def check_bool(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` if it is ``True`` or ``False`` (not a string, number or tensor standing for one);
    ``None`` passes when ``optional``."""
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        allowed = "True, False or None" if optional else "True or False"
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    return value


def check_choice(name: str, value: T, choices: Sequence[T]) -> T:
    """``value`` if it is one of ``choices`` (compared by type and value: ``1`` is not ``True``)."""
    if not any(value == c and (type(value) is type(c) or isinstance(c, str)) for c in choices):
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


#: The dtypes a frozen backbone may be held in (``SOP(backbone_dtype=...)``), by name.
BACKBONE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_dtype(name: str, value: Any, allowed: dict[str, torch.dtype], *, optional: bool = False) -> str | None:
    """The name of ``value`` (a ``torch.dtype`` or its name, ``"bfloat16"``) if it is one of ``allowed``."""
    if value is None and optional:
        return None
    names = {dtype: key for key, dtype in allowed.items()}
    if isinstance(value, torch.dtype) and value in names:
        return names[value]
    if isinstance(value, str) and value.removeprefix("torch.") in allowed:
        return value.removeprefix("torch.")
    choices = ", ".join(allowed) + (" or None" if optional else "")
    if not isinstance(value, (str, torch.dtype)):
        raise TypeError(f"{name} must be a torch.dtype or its name ({choices}), got {type(value).__name__}")
    raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_path(name: str, value: Any, *, optional: bool = False, directory: bool | None = None) -> Any:
    """``value`` if it is a non-empty ``str`` or ``os.PathLike`` (``None`` passes when ``optional``); with
    ``directory`` True (False), a path that exists must be a directory (must not be one)."""
    if value is None and optional:
        return None
    allowed = "a path (str or os.PathLike)" + (" or None" if optional else "")
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    if not os.fspath(value):
        raise ValueError(f"{name} must be {allowed}, got an empty path ('' would mean the current directory)")
    if directory is not None and os.path.exists(value) and os.path.isdir(value) != directory:
        wanted = "a directory" if directory else "a file, not a directory"
        raise ValueError(f"{name} must be {wanted}, got {os.fspath(value)!r}")
    return value


class Checked:
    """A class attribute whose every assignment goes through ``check(name, value)`` (kept as ``_name``):
    an option that may change after construction is checked as the constructor checks it."""

    def __init__(self, check: Callable[[str, Any], Any], doc: str = ""):
        self.check, self.__doc__ = check, doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, "_" + self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        object.__setattr__(obj, "_" + self.name, self.check(self.name, value))


def check_tau(tau: Any, name: str = "tau") -> float:
    """The fraction of features a group keeps, in ``(0, 1]``."""
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real):
        raise TypeError(f"{name} must be a float in (0, 1], got {tau!r} ({type(tau).__name__})")
    if not 0.0 < float(tau) <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1], got {tau!r}")
    return float(tau)


def check_levels(name: str, levels: Any) -> tuple[float, ...] | None:
    """``levels`` as a non-empty tuple of levels in ``(0, 1]`` (``None`` passes)."""
    if levels is None:
        return None
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or len(levels) == 0:
        raise ValueError(f"{name} must be a non-empty sequence of levels in (0, 1] or None, got {levels!r}")
    return tuple(check_tau(z, f"{name}[{i}]") for i, z in enumerate(levels))


def check_text_only(modality: str, **given: Any) -> None:
    """Arguments only text backbones take (``attention_mask``, ``token_type_ids``) are ``None`` unless
    ``modality`` is ``"text"`` (an image model would ignore them)."""
    extra = [name for name, value in given.items() if value is not None]
    if extra and modality != "text":
        raise ValueError(f"{extra[0]} is for text backbones; this {modality} backbone takes the images alone")


# -- tensors -----------------------------------------------------------------------------------
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_tensor(name: str, value: Any) -> torch.Tensor:
    """``value`` if it is a ``torch.Tensor``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_float(name: str, value: Any) -> torch.Tensor:
    """``value`` if it is a float32/float16/bfloat16/float64 tensor."""
    check_tensor(name, value)
    if value.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {value.dtype}")
    return value


def check_rank(name: str, value: Any, rank: int, layout: str) -> torch.Tensor:
    """``value`` if it is a tensor of ``rank`` dimensions (``layout`` names them, e.g. ``"[N, C]"``)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(value).__name__}")
    if value.dim() != rank:
        raise ValueError(f"{name} must have shape {layout} ({rank} dimensions), got shape {tuple(value.shape)}")
    return value


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """All given tensors (``None`` skipped) on one device."""
    present = {k: v for k, v in tensors.items() if v is not None}
    if len({v.device for v in present.values()}) > 1:
        listing = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_same_length(**tensors: torch.Tensor) -> None:
    """All given tensors hold the same number of examples (their first dimension)."""
    sizes = {name: int(t.shape[0]) for name, t in tensors.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"all inputs need the same number of examples, got {sizes}")


class NonFiniteError(ValueError):
    """Values a model computes became NaN or infinite (what a diverged training run produces)."""


def reads_on_host(device: torch.device) -> bool:
    """Whether :func:`check_values` reads its condition on the host for tensors on ``device``: on the CPU
    (a read there waits for nothing); tests replace it to run the device-side assertions on the CPU."""
    return device.type == "cpu"


def check_values(
    ok: torch.Tensor, message: str, details: Callable[[], str] | None = None, error: type[Exception] = ValueError
) -> None:
    """A check of tensor values (a finite input, labels in range) that costs a GPU no host sync.

    ``ok`` a one-element bool tensor.  On the CPU a False ``ok`` raises ``error(message + details())``
    (``details`` names the offending values).  On a GPU the check is ``torch._assert_async``: nothing is
    read back; a False ``ok`` fails the next synchronising call as a device-side assertion (rerun on the
    CPU, or with ``CUDA_LAUNCH_BLOCKING=1``, to see ``message``).  Meta tensors have no values to check.
    Under ``torch.compile`` it is the assertion on every device (a host read would break the graph).
    """
    if ok.device.type == "meta":
        return
    if torch.compiler.is_compiling() or not reads_on_host(ok.device):
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise error(message + (details() if details is not None else ""))


def check_class_ids(name: str, ids: Any, count: int, what: str = "classes") -> torch.Tensor:
    """``ids`` if it is an integer tensor (not bool) with values in ``[0, count)`` (a ValueError naming the
    values outside; on a GPU a device-side assertion)."""
    check_tensor(name, ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of ids in [0, {count}), got dtype {ids.dtype}")
    if ids.numel():
        check_values(
            ((ids >= 0) & (ids < count)).all(),
            f"{name} must lie in [0, {count - 1}] (the {count} {what})",
            lambda: f", got {sorted({int(v) for v in ids.flatten().tolist() if not 0 <= v < count})[:5]}",
        )
    return ids


def check_grid(grid: object, d: int) -> tuple[int, int]:
    """A feature grid ``(h, w)``: two positive integers with ``h · w = d``."""
    try:
        # ``grid`` is unchecked input: a non-iterable raises the TypeError caught below.
        h, w = (operator.index(side) for side in cast(Iterable[SupportsIndex], grid))
    except (TypeError, ValueError):
        raise ValueError(f"grid must be two positive integers (h, w) with h · w = d={d}, got {grid!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"grid sides must be positive integers, got {grid!r}")
    if h * w != d:
        raise ValueError(f"grid {(h, w)} has {h * w} cells but logits have d={d} features")
    return h, w


# -- command-line values -------------------------------------------------------------------------
def finite_float(text: str) -> float:
    """An ``argparse`` type: a finite number (``nan`` and ``inf`` are refused, naming the value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


finite_float.__name__ = "finite number"
