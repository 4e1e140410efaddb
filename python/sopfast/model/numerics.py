"""Subnormal floats in SOP's backward pass on the CPU, flushed to zero (issue #24, item 6).

A saturated generator softmax (training drives its logits there, ``docs/quality.md``) leaves most
attention values at 0 or subnormal (below 1.2e-38 in fp32), and so the gradients flowing back through
them; x86 CPUs compute on subnormal operands many times slower, and a ``drop`` training step's backward
took 10–35× longer (``bench/RESULTS_denormals.md``).  :func:`sopfast.train` runs each backward inside
:func:`flush_denormal`; with another training loop wrap ``loss.backward()`` in it.

The flag belongs to each thread; with the compiled extension (``sopfast._C``) it is set on torch's
intra-op threads too (:func:`set_flush_denormal`), where the matmuls of a multi-threaded backward run;
without it only the calling thread flushes.

Only the backward: the forward keeps subnormal attention, which the authors' tie rule ranks
(``docs/method.md``, step 6).  Flushed, 74 of 80 groups of a saturated ViT changed, and the forward
gained no time.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..ops._backends import native_extension


def flushing_denormals() -> bool:
    """Whether the calling thread flushes subnormal floats to zero now.  torch has no getter; the
    flag is the CPU's (x86 MXCSR FTZ), which every float operation of the thread obeys, so half the
    smallest normal float comes out as 0.0 exactly when it is set."""
    smallest = sys.float_info.min
    return smallest * 0.5 == 0.0


def intra_op_threads_flushing() -> list[bool] | None:
    """Whether each of torch's ``torch.get_num_threads()`` intra-op threads flushes subnormal floats now
    (entry 0: the calling thread), or ``None`` without the compiled extension, which can ask them."""
    extension = native_extension()
    return None if extension is None else list(extension.intra_op_threads_flushing())


def set_flush_denormal(on: bool | list[bool]) -> bool:
    """``torch.set_flush_denormal(on)`` on the calling thread and, with the compiled extension, on every
    intra-op thread (torch's own call reaches the caller only); a list sets thread i to ``on[i]`` (as
    :func:`intra_op_threads_flushing` reads them; its last entry for threads beyond it).  Returns whether
    the CPU supports it."""
    states = [on] if isinstance(on, bool) else on
    extension = native_extension()
    if extension is None:
        return torch.set_flush_denormal(states[0])
    return bool(extension.set_intra_op_threads_flushing(states))


@contextmanager
def flush_denormal(enabled: bool = True) -> Iterator[bool]:
    """Inside the ``with`` block subnormal floats are flushed to zero (:func:`set_flush_denormal`: the
    calling thread, where the CPU backward runs, and torch's intra-op threads, where its matmuls and
    elementwise ops split); each thread's state found is restored after, also on an exception.
    ``enabled=False`` changes nothing.  Yields whether flushing is on (False where the CPU does not
    support it: x86 without SSE3, Arm).
    """
    if not enabled:
        yield False
        return
    previous = intra_op_threads_flushing() or [flushing_denormals()]
    supported = set_flush_denormal(True)
    try:
        yield supported
    finally:
        set_flush_denormal(previous)
