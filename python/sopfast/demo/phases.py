"""The demo's phases, said as they start and end: ``[2/6] training SOP on the backbone as trained (seed 0),
about 2 min on 2 CPU cores`` … ``done in 97 s``.  The expected times were measured on the 2-core machine the
README names (``bench/quality/demo_cost.md``); each phase has a progress bar of its own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Seconds a phase took on the README's 2-core machine, quiet, 2 threads (``bench/quality/demo_cost.md``),
#: by demo scale (the text demo's with a ``text-`` prefix) and kind of phase; a kind that is missing, or a
#: scale never timed quietly (``full``, ``quick``), is said without a time.
EXPECTED: dict[str, dict[str, float]] = {
    "default": {"backbone": 140.0, "sop": 30.0, "evaluate": 50.0, "adapt": 17.0},
    "text-default": {"backbone": 105.0, "sop": 155.0, "evaluate": 250.0},
}


def image_phases(scale: Any, seeds: int, cache: bool) -> int:
    """How many phases the image demo at ``scale`` runs with ``seeds`` SOP seeds: the backbone, SOP's training
    and evaluation for each seed on both backbones, the adaptation, and the epoch timing when it times."""
    return 1 + 2 * 2 * seeds + 1 + int(scale.timing)


def _about(seconds: float) -> str:
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {seconds:.0f} s"


class Phases:
    """Numbered phases of one demo run (``total`` of them) at ``scale`` (a key of :data:`EXPECTED`)."""

    def __init__(self, total: int, scale: str) -> None:
        self.total, self.done, self.expected = total, 0, EXPECTED.get(scale, {})

    @contextmanager
    def phase(self, title: str, kind: str, unless: str = "") -> Iterator[None]:
        """Print ``title`` numbered, with the time a ``kind`` of phase is expected to take (and ``unless``, when
        the phase can be much shorter: ``"seconds when an earlier run cached it"``), then its duration."""
        self.done += 1
        expected = self.expected.get(kind)
        when = f", {_about(expected)} on 2 CPU cores" if expected else ""
        if expected and unless:
            when += f" ({unless})"
        print(f"[{self.done}/{self.total}] {title}{when}", flush=True)
        start = time.perf_counter()
        yield
        print(f"[{self.done}/{self.total}] done in {time.perf_counter() - start:.0f} s", flush=True)
