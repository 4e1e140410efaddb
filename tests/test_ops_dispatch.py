"""Backend selection of the ops (SOPFAST_BACKEND, backends()) and torch.compile over them."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

import sopfast
from op_testing import NATIVE, needs_cpp
from sopfast.ops import _backends, backends, gather_tokens, select_backend, sparsemax, top_tau

# the modules (sopfast.ops re-exports functions of the same names)
gather_tokens_module = importlib.import_module("sopfast.ops.gather_tokens")
sparsemax_module = importlib.import_module("sopfast.ops.sparsemax")
top_tau_module = importlib.import_module("sopfast.ops.top_tau")


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


class CallCounter:
    """Wraps a function and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def run_every_op(requires_grad: bool = True) -> None:
    x = torch.randn(3, 8, requires_grad=requires_grad)
    loss = sparsemax(x).square().sum() + top_tau(x, tau=0.25, ties="logits").lam.sum()
    tokens = torch.randn(3, 8, 4, requires_grad=requires_grad)
    loss = loss + gather_tokens(tokens, torch.randint(-1, 8, (3, 2, 3)), prefix=1).sum()
    loss.backward()


@pytest.fixture
def reference_counters(monkeypatch):
    """Counts the calls of every op's reference forward and backward."""
    counters = {}
    for module, names in [
        (sparsemax_module, ["sparsemax_reference", "sparsemax_backward_reference"]),
        (top_tau_module, ["top_tau_reference", "top_tau_backward_reference"]),
        (gather_tokens_module, ["gather_tokens_reference", "gather_tokens_backward_reference"]),
    ]:
        for name in names:
            counters[name] = CallCounter(getattr(module, name))
            monkeypatch.setattr(module, name, counters[name])
    return counters


@needs_cpp
def test_backends_report_cpp_when_built(monkeypatch):
    monkeypatch.delenv("SOPFAST_BACKEND", raising=False)
    info = backends()
    assert info["available"]["cpp"] is True and info["cpu"] == "cpp" and info["forced"] is None
    assert select_backend(torch.zeros(1)) == "cpp"
    assert info["available"]["cuda"] == (_backends.has_cuda_kernels() and torch.cuda.is_available())


@needs_cpp
def test_cpu_tensors_run_the_extension_by_default(monkeypatch, reference_counters):
    monkeypatch.delenv("SOPFAST_BACKEND", raising=False)
    run_every_op()
    assert all(counter.calls == 0 for counter in reference_counters.values())


# op -> one forward and backward of it through the public op on ``device``
OP_RUNS = {
    "sparsemax": lambda device: sparsemax(torch.randn(3, 4, device=device, requires_grad=True)).sum().backward(),
    "top_tau": lambda device: (
        top_tau(torch.randn(4, 9, device=device, requires_grad=True), tau=0.3, ties="logits").lam.sum().backward()
    ),
    "gather_tokens": lambda device: (
        gather_tokens(
            torch.randn(2, 5, 3, device=device, requires_grad=True), torch.randint(-1, 5, (2, 2, 2), device=device), 1
        )
        .sum()
        .backward()
    ),
}


def test_every_op_is_registered_with_regular_names():
    assert sorted(_backends.OPS) == sorted(
        f"{op}_{direction}" for op in OP_RUNS for direction in ("forward", "backward")
    )
    if _backends.has_cpp():
        ext = _backends.native_extension()
        for name, op in _backends.OPS.items():
            assert op.implementation("cpp") is getattr(ext, f"{name}_cpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        _backends.OPS["sparsemax_forward"].implementation("fortran")


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("op", list(OP_RUNS))
def test_native_backend_runs_its_kernels_not_the_reference(backend, device, op, use_backend, monkeypatch):
    use_backend(backend)

    def fail(*_):
        raise AssertionError("the reference ran")

    for direction in ("forward", "backward"):
        monkeypatch.setattr(_backends.OPS[f"{op}_{direction}"], "reference", fail)
    OP_RUNS[op](device)


def test_triton_wrappers_launch_on_their_inputs_device(monkeypatch):
    """Triton launches on the current device: every wrapper enters ``on_device`` of its input."""
    kernels = pytest.importorskip("sop_kernels")
    launch = importlib.import_module("sop_kernels._launch")

    class FakeCudaTensor:
        device = torch.device("cuda", 1)

    guard = launch.on_device(FakeCudaTensor())
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    seen = []

    def spy(tensor):
        seen.append(tensor)
        return launch.on_device(tensor)

    for name in ("sparsemax", "top_tau", "gather_tokens"):
        monkeypatch.setattr(importlib.import_module(f"sop_kernels.{name}"), "on_device", spy)
    x, p = torch.randn(2, 5), torch.softmax(torch.randn(2, 5), -1)
    tokens, indices = torch.randn(1, 4, 3), torch.tensor([[[1, 2]]])
    mask = torch.ones(2, 5, dtype=torch.bool)
    calls = [
        (kernels.sparsemax_forward, (x,)),
        (kernels.sparsemax_backward, (p, x)),
        (kernels.top_tau_forward, (x, torch.ones(2, dtype=torch.int64), 1, None, True, True, None, 0, 0)),
        (kernels.top_tau_backward, (p, mask, x[:, 0], x[:, 1], None, None, 0, 0)),
        (kernels.gather_tokens_forward, (tokens, indices, 1)),
        (kernels.gather_tokens_backward, (torch.randn(1, 3, 3), indices, 1, 4)),
    ]
    for wrapper, args in calls:
        seen.clear()
        wrapper(*args)
        assert seen and seen[0].device == args[0].device, wrapper.__name__


def test_no_host_sync_where_the_result_does_not_need_one():
    """Meta tensors have no data: any device-to-host transfer (``int(t)``, ``bool(t)``, ``.tolist()``)
    raises.  top_tau with tau or an int k, with or without a valid mask (k_max known on the host, valid
    checked on the device), and gather_tokens (the index range checked on the device) run on them,
    forward and backward; with a tensor k the output width is its maximum, so that path transfers it
    (once), and a meta k, which holds no values, is refused."""
    logits = torch.randn(4, 196, device="meta", requires_grad=True)
    valid = torch.ones(4, 196, dtype=torch.bool, device="meta")
    for kwargs in (
        dict(tau=0.2, blur_kernel_size=3, grid=(14, 14)),
        dict(k=7, ties="logits"),
        dict(tau=0.2, valid=valid),
        dict(k=7, valid=valid),
    ):
        result = top_tau(logits, **kwargs)
        assert result.indices.device.type == "meta" and result.indices.shape[1] == (39 if "tau" in kwargs else 7)
        result.lam.sum().backward()
    tokens = torch.randn(2, 9, 8, device="meta", requires_grad=True)
    gather_tokens(tokens, torch.zeros(2, 3, 4, dtype=torch.int64, device="meta"), prefix=1).sum().backward()
    assert tokens.grad.shape == tokens.shape
    sparsemax(torch.randn(3, 20, device="meta", requires_grad=True)).sum().backward()
    with pytest.raises(ValueError, match="k must be an int or a tensor with values"):
        top_tau(logits, k=torch.full((4,), 7, device="meta"))


def test_torch_backend_forces_every_reference(monkeypatch, reference_counters):
    monkeypatch.setenv("SOPFAST_BACKEND", "torch")
    assert backends()["cpu"] == "torch" and select_backend(torch.zeros(1)) == "torch"
    run_every_op()
    assert all(counter.calls == 1 for counter in reference_counters.values()), reference_counters


def test_use_backend_is_scoped_and_wins_over_the_environment(monkeypatch, reference_counters):
    monkeypatch.setenv("SOPFAST_BACKEND", "cpp")
    with sopfast.ops.use_backend("torch"):
        assert backends()["cpu"] == "torch" and select_backend(torch.zeros(1)) == "torch"
        run_every_op()
    assert all(counter.calls == 1 for counter in reference_counters.values()), reference_counters
    assert backends()["cpu"] == "cpp"
    with pytest.raises(ValueError, match="backend='fortran' is not a backend"), sopfast.ops.use_backend("fortran"):
        pass


def test_unknown_backend_raises(monkeypatch):
    monkeypatch.setenv("SOPFAST_BACKEND", "fortran")
    with pytest.raises(ValueError, match="SOPFAST_BACKEND='fortran' is not a backend"):
        backends()
    with pytest.raises(ValueError, match="not a backend"):
        select_backend(torch.zeros(1))


@needs_cpp
def test_torch_compile_matches_eager(monkeypatch):
    monkeypatch.delenv("SOPFAST_BACKEND", raising=False)
    torch._dynamo.reset()

    def pipeline(logits, tokens, indices):
        weights = sparsemax(logits)
        groups = top_tau(logits, tau=0.25, blur_kernel_size=3)
        picked = gather_tokens(tokens, indices, prefix=1)
        return (weights * groups.attention).sum(dim=-1) * groups.lam + picked.mean(dim=(1, 2))

    logits = torch.randn(4, 16, requires_grad=True)
    tokens = torch.randn(4, 16, 8)
    indices = torch.randint(0, 16, (4, 1, 5))
    # aot_eager traces the ops through their fake kernels and the C++ autograd without inductor's codegen;
    # fullgraph: no graph break at the ops
    compiled = torch.compile(pipeline, backend="aot_eager", fullgraph=True)
    eager_out = pipeline(logits, tokens, indices)
    compiled_out = compiled(logits, tokens, indices)
    torch.testing.assert_close(compiled_out, eager_out)
    (eager_grad,) = torch.autograd.grad(eager_out.sum(), logits)
    (compiled_grad,) = torch.autograd.grad(compiled(logits, tokens, indices).sum(), logits)
    torch.testing.assert_close(compiled_grad, eager_grad)


OP_NAMES = ("sparsemax", "sparsemax_backward", "top_tau", "top_tau_backward", "gather_tokens", "gather_tokens_backward")


def test_the_composites_are_ops_too():
    """group_select and aggregate: torch.ops.sopfast.<op>, one implementation for every device, differentiable."""
    queries, z = torch.randn(3, 8, requires_grad=True), torch.randn(2, 5, 8)
    eye = torch.eye(8)
    c = torch.ops.sopfast.group_select(queries, z, eye, eye, 2.0)
    torch.testing.assert_close(c, sopfast.ops.group_select_reference(queries, z, eye, eye, 2.0))
    lam, y = torch.rand(2, 5), torch.randn(2, 5, 3)
    out = torch.ops.sopfast.aggregate(c, lam, y)
    torch.testing.assert_close(out, sopfast.ops.aggregate_reference(c, lam, y))
    out.sum().backward()
    assert queries.grad is not None and torch.isfinite(queries.grad).all()


@needs_cpp
def test_every_op_is_in_the_dispatcher_with_a_kernel_per_key():
    """torch.ops.sopfast.<op>: the C++ kernel for CPU (csrc/registration.cpp), the autograd once in C++
    (csrc/autograd.cpp; not for top_tau_backward, whose create_graph path is the forward's), the fake
    kernel for Meta, the reference for any other device; CUDA per default_backend."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in OP_NAMES:
        qualified = f"sopfast::{name}"
        assert callable(getattr(torch.ops.sopfast, name))
        dump = torch._C._dispatch_dump(qualified)
        assert "CPU: registered at" in dump and "csrc/registration.cpp" in dump.split("CPU: registered at")[1]
        assert has_kernel(qualified, "Meta") and has_kernel(qualified, "CompositeExplicitAutograd")
        assert ("csrc/autograd.cpp" in dump) == (name != "top_tau_backward"), dump
    assert _backends.default_backend("cpu") == "cpp"


@pytest.mark.parametrize(
    ("cuda_kernels", "gpu", "triton", "expected"),
    [
        (True, True, True, "cuda"),
        (False, True, True, "triton"),
        (False, False, True, "torch"),
        (False, True, False, "torch"),
    ],
)
def test_a_cuda_build_runs_ahead_of_triton_on_cuda_tensors(monkeypatch, cuda_kernels, gpu, triton, expected):
    """Issue #29: Triton 3.6 could not compile top_tau at 49–1,024 features on an H200, where the CUDA
    kernels passed every op check."""
    monkeypatch.setattr(_backends, "has_cpp", lambda: True)
    monkeypatch.setattr(_backends, "has_cuda_kernels", lambda: cuda_kernels)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(_backends, "triton_kernels", lambda: object() if triton else None)
    assert _backends.default_backend("cuda") == expected


@needs_cpp
def test_the_ops_called_through_torch_ops_match_the_public_ops():
    x = torch.randn(4, 20, requires_grad=True)
    p = torch.ops.sopfast.sparsemax(x)
    assert torch.equal(p, sparsemax(x))
    (grad,) = torch.autograd.grad(p.square().sum(), x)
    assert torch.equal(grad, torch.autograd.grad(sparsemax(x).square().sum(), x)[0])
    logits = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    indices, mask, *_ = torch.ops.sopfast.top_tau(logits, None, 4, None, True, True, None, 0, 0)
    expected = top_tau(logits, k=4)
    assert torch.equal(indices, expected.indices) and torch.equal(mask, expected.mask)

    def lam_and_attention(t):
        return torch.ops.sopfast.top_tau(t, None, 4, None, True, False, None, 0, 0)[2:]

    assert torch.autograd.gradcheck(lam_and_attention, logits)
    tokens = torch.randn(2, 6, 3, requires_grad=True)
    chosen = torch.randint(-1, 6, (2, 2, 3))
    assert torch.equal(torch.ops.sopfast.gather_tokens(tokens, chosen, 1), gather_tokens(tokens, chosen, 1))


@needs_cpp
def test_the_environment_is_read_where_documented(monkeypatch, reference_counters):
    """SOPFAST_BACKEND set after import applies once backends() (or use_backend, select_backend) reads it."""
    monkeypatch.setenv("SOPFAST_BACKEND", "torch")
    assert backends()["forced"] == "torch"
    sparsemax(torch.randn(2, 3))
    assert reference_counters["sparsemax_reference"].calls == 1
    monkeypatch.setenv("SOPFAST_BACKEND", "")
    assert backends()["forced"] is None
    sparsemax(torch.randn(2, 3))
    assert reference_counters["sparsemax_reference"].calls == 1


@needs_cpp
def test_an_override_refuses_tensors_its_backend_cannot_take():
    refuse = _backends.OPS["sparsemax_forward"].kernel_on("cpp", "cuda")
    with pytest.raises(RuntimeError, match="backend 'cpp' needs CPU tensors, got cuda tensors"):
        refuse(torch.zeros(1))


def test_without_the_extension_the_ops_are_their_differentiable_references(tmp_path):
    """SOPFAST_NO_EXTENSION installs: sopfast._C missing, every op is its reference
    (CompositeImplicitAutograd), gradients flow, one warning, torch.ops.sopfast still callable."""
    script = """
import sys, warnings
sys.modules["sopfast._C"] = None  # as if never built
import torch
from sopfast import ops
assert ops.backends()["available"] == {"torch": True, "cpp": False, "triton": False, "cuda": False}
x = torch.randn(3, 8, requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    p = ops.sparsemax(x)
    ops.sparsemax(x)
assert len([w for w in caught if "sopfast._C is not available" in str(w.message)]) == 1
(grad,) = torch.autograd.grad(p.square().sum(), x)
expected = torch.autograd.grad(ops.sparsemax_reference(x).square().sum(), x)[0]
assert torch.allclose(grad, expected)
ops.top_tau(x, 0.25, blur_kernel_size=3).lam.sum().backward()
groups = ops.top_tau(x, 0.25)
assert torch.equal(torch.ops.sopfast.top_tau(x, None, 2, None, True, True, None, 0, 0)[0], groups.indices)
tokens = torch.randn(2, 5, 3, requires_grad=True)
ops.gather_tokens(tokens, torch.randint(-1, 5, (2, 2, 2)), 1).sum().backward()
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]


@needs_cpp
def test_a_tiny_sop_forward_compiles_to_one_graph_through_the_ops():
    """torch.compile(fullgraph=True) of a whole SOP forward (tiny HF ViT, drop and exact): no graph break
    anywhere, the ops in the graph, the outputs those of eager. The agreement prior is off: it adds the
    backbone's own full-input forward, whose Hugging Face output-capture hooks dynamo cannot enter (a lock);
    with it on, the next test compiles with that break."""
    from sopfast.testing import make_hf_vit

    backbone = make_hf_vit()
    model = sopfast.SOP(backbone, num_groups=4, tau=0.25, agreement_prior=0.0).eval()
    x = torch.randn(2, 3, backbone.config.image_size, backbone.config.image_size)
    graphs = []

    def record(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    for mode in ("drop", "exact"):
        torch._dynamo.reset()
        graphs.clear()
        compiled = torch.compile(lambda t, mode=mode: model(t, mode=mode).logits, backend=record, fullgraph=True)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x, mode=mode).logits)
        code = graphs[0].code
        assert len(graphs) == 1 and "sopfast.top_tau" in code and "sopfast.group_select" in code, code
        assert ("sopfast.gather_tokens" in code) == (mode == "drop")


def test_a_sop_forward_with_the_agreement_prior_compiles_to_the_eager_outputs():
    """The default recipe's agreement prior (the backbone's full-input forward in the selector) under
    torch.compile without fullgraph: the outputs those of eager, in both modes."""
    from sopfast.testing import make_hf_vit

    backbone = make_hf_vit()
    model = sopfast.SOP(backbone, num_groups=4, tau=0.25).eval()
    assert model.config["agreement_prior"] > 0
    x = torch.randn(2, 3, backbone.config.image_size, backbone.config.image_size)
    for mode in ("drop", "exact"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda t, mode=mode: model(t, mode=mode).logits)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x, mode=mode).logits)


@needs_cpp
def test_a_bad_backend_in_the_environment_at_import_warns_and_the_defaults_run():
    """SOPFAST_BACKEND is read when sopfast.ops is imported (``import sopfast`` alone imports no torch)."""
    script = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    from sopfast import ops
import sopfast
assert any("SOPFAST_BACKEND='fortran' is not a backend" in str(w.message) for w in caught)
assert sopfast.ops.sparsemax(torch.tensor([[1.0, 3.0]])).tolist() == [[0.0, 1.0]]
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "SOPFAST_BACKEND": "fortran"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]
