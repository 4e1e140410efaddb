"""Subnormal floats in SOP's backward pass on the CPU, flushed to zero (issue #24, item 6).

A saturated generator softmax (training drives its logits there, ``docs/quality.md``) leaves most
attention values at 0 or subnormal (below 1.2e-38 in fp32), and so the gradients flowing back through
them; x86 CPUs compute on subnormal operands many times slower, and a ``drop`` training step's backward
took 10–35× longer (``bench/RESULTS_denormals.md``).  :func:`sopfast.train` runs each backward inside
:func:`flush_denormal`; with another training loop wrap ``loss.backward()`` in it.

Only the backward: the forward keeps subnormal attention, which the authors' tie rule ranks
(``docs/method.md``, step 6).  Flushed, 74 of 80 groups of a saturated ViT changed, and the forward
gained no time.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def flushing_denormals() -> bool:
    """Whether the calling thread flushes subnormal floats to zero now.  torch has no getter; the
    flag is the CPU's (x86 MXCSR FTZ), which every float operation of the thread obeys, so half the
    smallest normal float comes out as 0.0 exactly when it is set."""
    smallest = sys.float_info.min
    return smallest * 0.5 == 0.0


@contextmanager
def flush_denormal(enabled: bool = True) -> Iterator[bool]:
    """Inside the ``with`` block subnormal floats are flushed to zero (``torch.set_flush_denormal``);
    the state found is restored after, also on an exception.  ``enabled=False`` changes nothing.
    Yields whether flushing is on (False where the CPU does not support it: x86 without SSE3, Arm).

    The flag belongs to the calling thread: it holds for the ops it runs (the CPU backward runs on
    the thread that calls it), not for torch's intra-op worker threads.
    """
    if not enabled:
        yield False
        return
    previous = flushing_denormals()
    supported = torch.set_flush_denormal(True)
    try:
        yield supported
    finally:
        torch.set_flush_denormal(previous)
