"""Where the peak memory of one training step goes: ``drop`` (projection checkpointed) vs the authors'
algorithm (issue #24 item 5).

One step = zero_grad, forward, the paper's loss, backward, AdamW step on randomly initialised weights
(m = 20, τ = 0.2, fp32, ``recipe="paper"``), on the CPU.  AdamW's state is created before the step
(one step on zero gradients), as in a training loop.  Parameters, gradients and AdamW state are
counted from their tensors; the step's parts come from the allocation events of
``torch.profiler`` (``profile_memory=True``): the live bytes of the CPU allocator over time, read at
the start, end and peak of each phase (the projection forward, the group passes, the backward, …);
the total is the RSS high-water mark above the level before the step, as in ``training_memory.py``,
of a step run first without the profiler.

    python bench/training_memory_breakdown.py --batch 32 --variants drop --json drop.json
    python bench/training_memory_breakdown.py --batch 32 --variants authors --json authors.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import ExitStack
from unittest.mock import patch

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import sopfast
from sopfast import testing
from sopfast.benchmark import _release_free_heap, _rss_kib, peak_memory_mib
from sopfast.model.reference import reference_forward

MIB = 2**20
VARIANTS = ("drop", "authors")
# the adapter methods each variant's phases run in (wrapped with a profiler range)
PHASES = {
    "drop": {"projection": "embed", "group passes": "run_groups_sized"},
    "authors": {"projection": "reference_embed", "group passes": "full_forward"},
}


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class SavedTensors:
    """Bytes of the storages autograd saves for backward, by the phase that saved them first
    (parameters excluded: they are resident anyway)."""

    def __init__(self, model: torch.nn.Module):
        self.skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: set[int] = set()
        self.phase = "generator, selector and loss"
        self.bytes: dict[str, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.skip | self.seen:
            self.seen.add(storage.data_ptr())
            self.bytes[self.phase] = self.bytes.get(self.phase, 0) + storage.nbytes()
        return t

    def ranged(self, name: str, fn: Callable) -> Callable:
        """``fn`` in a profiler range ``phase:name``, its saved tensors counted under ``name``."""

        def run(*args, **kwargs):
            outer, self.phase = self.phase, name
            try:
                with record_function(f"phase:{name}"):
                    return fn(*args, **kwargs)
            finally:
                self.phase = outer

        return run


class Timeline:
    """Live bytes of the CPU allocator over a profiled run, read per ``phase:`` range."""

    def __init__(self, prof: profile):
        events = prof.profiler.kineto_results.events()
        cpu = [e for e in events if e.device_type().name == "CPU"]
        mem = sorted((e.start_ns(), e.nbytes()) for e in cpu if e.name() == "[memory]")
        self.times = torch.tensor([t for t, _ in mem], dtype=torch.int64)
        self.live = torch.tensor([n for _, n in mem], dtype=torch.float64).cumsum(0)
        self.ranges = {}
        for e in cpu:
            if e.name().startswith("phase:"):
                start, end = e.start_ns(), e.start_ns() + e.duration_ns()
                first, last = self.ranges.get(e.name()[6:], (start, end))
                self.ranges[e.name()[6:]] = (min(first, start), max(last, end))

    def _at(self, t: int) -> float:
        """Live bytes just before time ``t``."""
        i = int(torch.searchsorted(self.times, t))
        return 0.0 if i == 0 else float(self.live[i - 1])

    def phase(self, name: str) -> tuple[float, float, float]:
        """(live before, live after, peak within) the first-to-last span of ``name``'s ranges, bytes."""
        start, end = self.ranges[name]
        before, after = self._at(start), self._at(end + 1)
        inside = self.live[int(torch.searchsorted(self.times, start)) : int(torch.searchsorted(self.times, end + 1))]
        return before, after, max(before, float(inside.max())) if len(inside) else before


def breakdown(model: sopfast.SOP, inputs: tuple, labels: torch.Tensor, variant: str) -> dict[str, float]:
    """The parts of one training step's memory (MiB) for ``variant`` (``"drop"`` or ``"authors"``)."""
    model.train()
    model.checkpoint_projection = variant == "drop"
    params = model.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    for p in params:  # create AdamW's state before the measured step
        p.grad = torch.zeros_like(p)
    optimizer.step()

    def forward() -> sopfast.SOPOutput:
        return model(*inputs, mode="drop") if variant == "drop" else reference_forward(model, *inputs)

    def step(saved: SavedTensors) -> None:
        with record_function("phase:zero_grad"):
            optimizer.zero_grad(set_to_none=True)
        with record_function("phase:forward"), torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            loss = forward().loss(labels)
        with record_function("phase:backward"):
            loss.backward()
        with record_function("phase:optimizer"):
            optimizer.step()

    # the total from an unprofiled step: under the profiler the RSS grows more (drop, batch 32: 5.7 vs 1.7 GiB)
    _release_free_heap()
    rss_before = _rss_kib("VmRSS") / 1024
    total = peak_memory_mib(lambda: step(SavedTensors(model)), torch.device("cpu"))
    saved = SavedTensors(model)
    with ExitStack() as stack:
        for phase, method in PHASES[variant].items():
            wrapped = saved.ranged(phase, getattr(model.adapter, method))
            stack.enter_context(patch.object(model.adapter, method, wrapped))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
            step(saved)
    line = Timeline(prof)
    base = line.phase("zero_grad")[1]
    f0, f1, fpeak = line.phase("forward")
    _, g1, gpeak = line.phase("group passes")
    b0, _, bpeak = line.phase("backward")
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    parts = {
        "(a) backbone weights": nbytes([*model.backbone.parameters(), *model.backbone.buffers()]),
        "(b) trainable parameters": nbytes(params),
        "(c) their gradients": nbytes([p.grad for p in params if p.grad is not None]),
        "(d) AdamW state": nbytes(state),
        "(e) projection: saved for backward": saved.bytes.get("projection", 0),
        "(f) group passes: saved for backward": saved.bytes.get("group passes", 0),
        "(f) group passes: transient peak above their end": gpeak - g1,
        "(g) generator, selector and loss: saved for backward": saved.bytes.get("generator, selector and loss", 0),
        "forward: live at its end above its start": f1 - f0,
        "backward: peak above its start": bpeak - b0,
        "step peak above its start (allocator)": max(fpeak, bpeak) - base,
        "step peak above its start (RSS, the total)": total * MIB,
        "process RSS before the step": rss_before * MIB,
    }
    result = {k: v / MIB for k, v in parts.items()}
    result["peak in"] = "backward" if bpeak >= fpeak else "forward"
    return result


def main(argv: list[str] | None = None, backbone: torch.nn.Module | None = None) -> dict[str, dict]:
    """Print (and with ``--json`` write) each variant's parts; ``backbone`` defaults to a random ViT-B/16."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--json", default=None, help="write the parts (MiB) to this JSON file")
    args = parser.parse_args(argv)
    backbone = testing.vit("b16") if backbone is None else backbone
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g)
    labels = torch.randint(0, 2, (args.batch,), generator=g)
    results = {}
    for variant in args.variants:  # each on a fresh SOP over the same backbone
        model = sopfast.SOP(backbone, num_groups=20, tau=0.2, recipe="paper")
        results[variant] = breakdown(model, (x,), labels, variant)
    for variant, parts in results.items():
        for name, value in parts.items():
            print(f"{variant:8s} {name:48s} {value if isinstance(value, str) else f'{value:9.1f}'}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
