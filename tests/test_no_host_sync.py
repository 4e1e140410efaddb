"""No host sync in SOP's forward and training step (issue #24, item 3).

A GPU runs ahead of Python only while nothing reads tensor data back: ``.item()``, ``bool(t)``,
``int(t)``, ``.tolist()``, ``.cpu()``, and ops whose output shape depends on the data (``nonzero``,
boolean indexing, ``unique``) each wait for every queued kernel.  On the CPU :class:`HostReads` records
them (patched ``torch.Tensor`` methods, and a dispatch mode for the ops) while a forward and a training
step (backward, gradient clipping, AdamW) of a tiny SOP on HF ViT and BERT run, in both modes and both
recipes, with the value checks on their GPU path (:func:`sopfast.checks.check_values` as
``torch._assert_async``).  BERT ``drop``'s group widths are the one read of values, and no sync: bounds
counted from the inputs alone, copied to pinned host memory before the projection pass is queued and waited
for by their own event (:class:`sopfast.types.HostValues`).  On a GPU the same runs under
``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType, TracebackType
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sopfast
from sopfast import checks
from sopfast.ops import available_backends
from sopfast.testing import make_bert, make_hf_vit, text_batch

#: ``torch.Tensor`` methods that read data back to the host.
HOST_READ_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
#: Ops that read data back: a scalar, or an output shape that depends on the values.
DATA_DEPENDENT_OPS = frozenset(
    {
        "_local_scalar_dense",
        "is_nonzero",
        "equal",
        "nonzero",
        "argwhere",
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "bincount",
    }
)
#: The documented inherent reads of one SOP forward, by family and mode: ``(what, sopfast function)``.
INHERENT: dict[tuple[str, str], list[tuple[str, str]]] = {}
#: Reads of host copies started early in one SOP forward (no sync on a GPU), by family and mode.
HOST_COPIES = {("bert", "drop"): [("tolist", "types.py:values")]}
#: Forwards in :func:`_forward_and_step`.
FORWARDS = 2

SOPFAST_DIR = os.path.dirname(sopfast.__file__) + os.sep
# AdamW keeps its step counters on the host (for CUDA parameters too, unless capturable): reading them
# waits for no device, so reads made by torch.optim are not host syncs.
OPTIM_DIR = os.path.dirname(torch.optim.__file__) + os.sep


def _where(frame: FrameType | None) -> str | None:
    """``"path/in/sopfast.py:function"`` of the innermost sopfast frame from ``frame`` outwards, ``""`` when
    none (a read outside sopfast), ``None`` when torch.optim made the read."""
    site = ""
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(OPTIM_DIR):
            return None
        if not site and path.startswith(SOPFAST_DIR):
            site = f"{path[len(SOPFAST_DIR) :]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return site


def _is_bool_index(func: Any, args: tuple) -> bool:
    """Whether ``func(*args)`` indexes with a bool mask (its output size is the mask's count)."""
    if func.overloadpacket.__name__ not in ("index", "index_put", "index_put_"):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])


class _DataDependentOps(TorchDispatchMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in DATA_DEPENDENT_OPS or _is_bool_index(func, args):
            self.reads.record(f"aten.{name}", sys._getframe(1))
        return func(*args, **(kwargs or {}))


class HostReads:
    """Within ``with``: :attr:`found`, every host read of tensor data as ``(what, sopfast function)``
    (``""`` for reads outside sopfast; torch.optim's are left out)."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []
        self._saved: dict[str, Any] = {}
        self._mode = _DataDependentOps(self)

    def record(self, what: str, frame: FrameType | None) -> None:
        site = _where(frame)
        if site is not None:
            self.found.append((what, site))

    def _patched(self, name: str, original: Any) -> Any:
        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.record(name, sys._getframe(1))
            return original(tensor, *args, **kwargs)

        return method

    def __enter__(self) -> HostReads:
        for name in HOST_READ_METHODS:
            self._saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._patched(name, getattr(torch.Tensor, name)))
        self._mode.__enter__()
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._mode.__exit__(kind, error, trace)
        for name, original in self._saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)


def _vit_case() -> tuple[Any, tuple, dict]:
    return make_hf_vit(), (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)),), {}


def _bert_case() -> tuple[Any, tuple, dict]:
    ids, mask, types = text_batch()
    return make_bert(), (ids,), {"attention_mask": mask, "token_type_ids": types}


CASES = {"vit": _vit_case, "bert": _bert_case}


def _build(family: str, mode: str, recipe: str, device: str = "cpu") -> tuple[Any, Any, tuple, dict, Any]:
    """A tiny SOP, its AdamW (as :func:`sopfast.train` makes it), a batch and its labels, on ``device``."""
    backbone, args, kwargs = CASES[family]()
    torch.manual_seed(0)
    model = sopfast.SOP(backbone, num_groups=4, tau=0.25, mode=mode, recipe=recipe).to(device)
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-3)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    labels = torch.arange(args[0].shape[0], device=device) % model.num_classes
    return model, optimizer, args, kwargs, labels


def _forward_and_step(model: Any, optimizer: Any, args: tuple, kwargs: dict, labels: torch.Tensor) -> None:
    """An inference forward, then a training step as :class:`sopfast.training.trainer.Trainer` takes it."""
    model.eval()
    with torch.no_grad():
        model(*args, **kwargs)
    model.train()
    loss = model(*args, **kwargs, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


CPU_BACKENDS = [b for b in ("torch", "cpp") if available_backends()[b]]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("recipe", ["sopfast", "paper"])
@pytest.mark.parametrize("mode", ["exact", "drop"])
@pytest.mark.parametrize("family", list(CASES))
def test_forward_and_training_step_read_nothing_back(family, mode, recipe, backend, use_backend, monkeypatch):
    use_backend(backend)
    model, optimizer, args, kwargs, labels = _build(family, mode, recipe)
    _forward_and_step(model, optimizer, args, kwargs, labels)  # warm-up: AdamW's state, lazy setup
    monkeypatch.setattr(checks, "reads_on_host", lambda device: False)  # value checks as on a GPU
    with HostReads() as reads:
        _forward_and_step(model, optimizer, args, kwargs, labels)
    expected = INHERENT.get((family, mode), []) + HOST_COPIES.get((family, mode), [])
    assert reads.found == expected * FORWARDS


def test_bert_drop_widths_leave_for_the_host_before_the_projection_pass(monkeypatch):
    """The one read of a BERT ``drop`` forward is of a copy started before any projection layer runs."""
    model, _, args, kwargs, _ = _build("bert", "drop", "sopfast")
    calls: list[str] = []
    widths, embed = model.adapter.drop_widths, model.adapter.embed
    monkeypatch.setattr(model.adapter, "drop_widths", lambda *a: calls.append("widths") or widths(*a))
    monkeypatch.setattr(model.adapter, "embed", lambda *a: calls.append("embed") or embed(*a))
    with torch.no_grad():
        model(*args, **kwargs)
    assert calls == ["widths", "embed"]


def test_host_reads_finds_every_kind_of_read():
    """The recorder sees what the test above must fail on (so an added ``.item()`` fails it)."""
    x = torch.arange(6.0)
    with HostReads() as reads:
        x.sum().item()
        bool(x.any())
        int(x[0])
        float(x[1])
        x.tolist()
        x[x > 2]
        torch.nonzero(x)
        x.unique()
    found = [what for what, _ in reads.found]
    for what in ("item", "__bool__", "__int__", "__float__", "tolist", "aten.index", "aten.nonzero", "aten._unique2"):
        assert what in found, (what, found)
    assert all(site == "" for _, site in reads.found)  # made here, outside sopfast
    assert "item" not in torch.Tensor.__dict__  # the patches are gone


def test_host_reads_names_the_sopfast_function_and_leaves_out_torch_optim():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight])
    weight.grad = torch.ones(3)
    optimizer.step()
    with HostReads() as reads:
        checks.check_values(torch.tensor(True), "unused")
        optimizer.step()  # reads its host-side step counter
    assert reads.found == [
        ("__bool__", "checks.py:check_values"),
        ("aten._local_scalar_dense", "checks.py:check_values"),
    ]


def test_value_checks_raise_on_the_cpu_and_assert_on_the_device_path(monkeypatch):
    with pytest.raises(ValueError, match=r"labels must lie in .* got \[0, 7\]"):
        sopfast.model.losses.classification_loss(torch.zeros(2, 3), torch.tensor([0, 7]))
    checks.check_values(torch.tensor(False, device="meta"), "meta tensors hold no values")
    monkeypatch.setattr(checks, "reads_on_host", lambda device: False)
    with pytest.raises(RuntimeError, match="labels must lie in"):  # torch._assert_async, as on a GPU
        sopfast.model.losses.classification_loss(torch.zeros(2, 3), torch.tensor([0, 7]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("recipe", ["sopfast", "paper"])
@pytest.mark.parametrize("mode", ["exact", "drop"])
@pytest.mark.parametrize("family", list(CASES))
def test_no_sync_on_a_gpu(family, mode, recipe):
    """``torch.cuda.set_sync_debug_mode("error")`` fails every synchronising CUDA call (device-to-host
    copies, ``.item()``, stream syncs); where a read is inherent, ``"warn"`` counts them instead."""
    model, optimizer, args, kwargs, labels = _build(family, mode, recipe, "cuda")
    _forward_and_step(model, optimizer, args, kwargs, labels)
    torch.cuda.synchronize()
    inherent = INHERENT.get((family, mode), [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn" if inherent else "error")
        try:
            _forward_and_step(model, optimizer, args, kwargs, labels)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [f"{w.filename}:{w.lineno}" for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) == len(inherent) * FORWARDS, syncs
