"""top_tau: the C++ (and, on a GPU, CUDA) kernels against the PyTorch reference — masks and
indices bit for bit, lam and attention to fp32 rounding — plus autograd, edge cases,
properties of lam and bad inputs."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from op_testing import NATIVE, needs_cpp
from sopfast.ops import _backends, top_tau, top_tau_reference

# the modules (sopfast.ops re-exports functions of the same names)
top_tau_module = importlib.import_module("sopfast.ops.top_tau")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# lam and attention are computed in fp32 (fp64 for fp64 logits) by both sides: a few roundings apart
ATOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-6, torch.bfloat16: 2e-6}
INF = float("inf")

# name -> (d, grid, blur kernel size); grid None blurs along d
SHAPES = {
    "one_feature": (1, None, 0),
    "grid14_blur3": (196, (14, 14), 3),
    "grid14_noblur": (196, (14, 14), 0),
    "grid5x10_blur5": (50, (5, 10), 5),
    "line512_blur5": (512, None, 5),
    "line512_noblur": (512, None, 0),
}


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)

def run_top_tau(use_backend, backend, logits, **kwargs):
    """``top_tau`` on ``backend``; the logits tie rule unless ``ties=`` is given (the native
    kernels implement that one)."""
    use_backend(backend)
    kwargs.setdefault("ties", "logits")
    return top_tau(logits, **kwargs)


def assert_same_result(result, expected, atol):
    assert torch.equal(result.mask, expected.mask)
    assert torch.equal(result.indices, expected.indices)
    assert result.lam.dtype == expected.lam.dtype and result.attention.dtype == expected.attention.dtype
    torch.testing.assert_close(result.lam, expected.lam, atol=atol, rtol=0)
    torch.testing.assert_close(result.attention, expected.attention, atol=atol, rtol=0)


def random_valid(n, d, seed, device):
    valid = torch.rand(n, d, generator=torch.Generator().manual_seed(seed)) > 0.4
    valid[:, 0] = True  # every row keeps a feature
    return valid.to(device)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("with_valid", [False, True])
def test_forward_matches_reference(backend, device, dtype, shape, largest, with_valid, use_backend):
    d, grid, blur = SHAPES[shape]
    n = 24
    logits = torch.randn(n, d, generator=torch.Generator().manual_seed(d)).to(device=device, dtype=dtype)
    kwargs = dict(largest=largest, blur_kernel_size=blur, grid=grid)
    kwargs["valid"] = random_valid(n, d, seed=d, device=device) if with_valid else None
    result = run_top_tau(use_backend, backend, logits, tau=0.2, **kwargs)
    expected = run_top_tau(use_backend, "torch", logits, tau=0.2, **kwargs)
    assert_same_result(result, expected, ATOL[dtype])
    if with_valid:  # per-row k = floor(0.2 * valid count), at least 1
        counts = kwargs["valid"].sum(dim=-1)
        torch.testing.assert_close(result.mask.sum(dim=-1), (counts * 0.2).floor().long().clamp_min(1))


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("shape", ["grid14_blur3", "grid14_noblur", "line512_blur5", "grid5x10_blur5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_matches_reference(backend, device, shape, dtype, use_backend):
    d, grid, blur = SHAPES[shape]
    gen = torch.Generator().manual_seed(d)
    logits = torch.randn(16, d, generator=gen).to(device=device, dtype=dtype)
    w_lam = torch.randn(16, generator=gen).to(device)
    w_att = torch.randn(16, d, generator=gen).to(device)

    def grads(name, use_attention):
        leaf = logits.clone().requires_grad_()
        res = run_top_tau(use_backend, name, leaf, tau=0.25, blur_kernel_size=blur, grid=grid)
        loss = (res.lam * w_lam).sum() + ((res.attention * w_att).sum() if use_attention else 0)
        loss.backward()
        return leaf.grad

    for use_attention in (False, True):
        torch.testing.assert_close(grads(backend, use_attention), grads("torch", use_attention), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize(("grid", "blur"), [((4, 5), 3), (None, 3), (None, 0)])
def test_gradcheck_float64(backend, device, grid, blur, use_backend):
    use_backend(backend)
    logits = torch.randn(3, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    logits = logits.to(device).requires_grad_()

    def lam_and_attention(x):
        res = top_tau(x, tau=0.3, blur_kernel_size=blur, grid=grid)
        return res.lam, res.attention

    assert torch.autograd.gradcheck(lam_and_attention, (logits,), eps=1e-6, atol=1e-7)


@needs_cpp
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_k_bounds_and_ties(k, largest, use_backend):
    equal = torch.full((2, 7), 0.5)
    tied = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, -1.0, 3.0]] * 2)
    for logits in (equal, tied):
        result = run_top_tau(use_backend, "cpp", logits, k=k, largest=largest)
        assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=k, largest=largest), 1e-6)
    # all equal: the lowest indices win, whichever end is kept
    assert torch.equal(run_top_tau(use_backend, "cpp", equal, k=k, largest=largest).indices[0], torch.arange(k))


@needs_cpp
def test_ties_go_to_the_lower_index(use_backend):
    tied = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    assert run_top_tau(use_backend, "cpp", tied, k=2).indices.tolist() == [[1, 2]]
    assert run_top_tau(use_backend, "cpp", tied, k=2, largest=False).indices.tolist() == [[0, 3]]


@needs_cpp
@pytest.mark.parametrize(
    "row",
    [
        [INF, 0.0, INF, -1.0, 2.0],  # +inf: uniform attention over the +inf entries
        [-INF, 0.0, -INF, 1.0, 2.0],
        [3e38, -3e38, 1e38, 0.0, 2e38],  # huge logits: shifted by the max
        [1e-40, -1e-40, 0.0, -0.0, 5e-45],  # denormals and signed zeros
    ],
)
@pytest.mark.parametrize("largest", [True, False])
def test_special_values(row, largest, use_backend):
    logits = torch.tensor([row])
    result = run_top_tau(use_backend, "cpp", logits, k=2, largest=largest)
    assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=2, largest=largest), 1e-6)
    assert torch.isfinite(result.attention).all()


@needs_cpp
def test_k_per_row_and_padding(use_backend):
    logits = torch.randn(3, 10)
    k = torch.tensor([1, 10, 4])
    result = run_top_tau(use_backend, "cpp", logits, k=k)
    assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=k), 1e-6)
    assert result.indices.shape == (3, 10)
    assert (result.indices[0, 1:] == -1).all() and (result.indices[1] >= 0).all()
    assert result.lam[1].item() == pytest.approx(1.0)  # k = d keeps all the mass


@needs_cpp
def test_empty_batch_and_single_row(use_backend):
    empty = run_top_tau(use_backend, "cpp", torch.empty(0, 10), tau=0.3)
    assert empty.indices.shape == (0, 3) and empty.mask.shape == (0, 10)
    assert empty.lam.shape == (0,) and empty.attention.shape == (0, 10)
    one = torch.randn(1, 30)
    assert_same_result(
        run_top_tau(use_backend, "cpp", one, tau=0.5), run_top_tau(use_backend, "torch", one, tau=0.5), 1e-6
    )


@needs_cpp
def test_non_contiguous_and_expanded_logits(use_backend):
    base = torch.randn(20, 8)
    for logits in (base.t(), base.t()[:1].expand(6, 20), torch.randn(5, 40)[:, ::2]):
        assert not logits.is_contiguous()
        assert_same_result(
            run_top_tau(use_backend, "cpp", logits, tau=0.3, blur_kernel_size=3),
            run_top_tau(use_backend, "torch", logits.contiguous(), tau=0.3, blur_kernel_size=3),
            1e-6,
        )


@needs_cpp
def test_cpp_backend_runs_the_extension_not_the_reference(use_backend, monkeypatch):
    use_backend("cpp")

    def fail(*_):
        raise AssertionError("the reference ran")

    monkeypatch.setattr(top_tau_module, "top_tau_reference", fail)
    monkeypatch.setattr(top_tau_module, "top_tau_backward_reference", fail)
    logits = torch.randn(4, 9, requires_grad=True)
    top_tau(logits, tau=0.3, ties="logits").lam.sum().backward()


@needs_cpp
@settings(max_examples=40, deadline=None)
@given(
    data=st.integers(1, 60).flatmap(
        lambda d: st.tuples(
            st.lists(st.lists(st.floats(-30, 30, width=32), min_size=d, max_size=d), min_size=1, max_size=4),
            st.floats(0.01, 1.0),
            st.booleans(),
        )
    )
)
def test_property_lam_is_kept_minus_dropped_mass(data):
    rows, tau, largest = data
    logits = torch.tensor(rows)
    n, d = logits.shape
    k = torch.full((n,), max(1, int(tau * d)))
    indices, mask, lam, attention = _backends.native_extension().top_tau_forward(
        logits, k, int(k[0]), None, largest, None, 0, 0
    )
    assert ((lam >= -1 - 1e-6) & (lam <= 1 + 1e-6)).all()
    torch.testing.assert_close(lam, 2 * (attention * mask).sum(dim=-1) - 1, atol=1e-5, rtol=0)
    assert torch.equal(mask.sum(dim=-1), k)
    for row in range(n):
        assert indices[row].tolist() == mask[row].nonzero().flatten().tolist()
    sign = 1 if largest else -1  # every kept logit is at least as extreme as every dropped one
    weakest_kept = torch.where(mask, sign * logits, INF).amin(dim=-1)
    strongest_dropped = torch.where(mask, -INF, sign * logits).amax(dim=-1)
    assert (weakest_kept >= strongest_dropped).all()
    expected = top_tau_reference(logits, k, int(k[0]), None, largest)
    assert torch.equal(mask, expected.mask)


@needs_cpp
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(logits=torch.randn(5), tau=0.5), ValueError, "2 dimensions"),
        (dict(logits=torch.ones(2, 5, dtype=torch.int64), tau=0.5), TypeError, "float32"),
        (dict(logits=torch.randn(2, 5), tau=0.0), ValueError, "tau must lie in"),
        (dict(logits=torch.randn(2, 5), tau=1.5), ValueError, "tau must lie in"),
        (dict(logits=torch.randn(2, 5), tau=0.5, k=2), ValueError, "exactly one"),
        (dict(logits=torch.randn(2, 5), k=6), ValueError, "k must lie in"),
        (dict(logits=torch.randn(2, 5), tau=0.5, valid=torch.ones(2, 5)), ValueError, "bool"),
        (dict(logits=torch.randn(2, 5), tau=0.5, valid=torch.ones(2, 5, dtype=torch.bool, device="meta")),
         ValueError, "one device"),
        (dict(logits=torch.randn(2, 6), tau=0.5, grid=(2, 2)), ValueError, "cells"),
        (dict(logits=torch.randn(2, 6), tau=0.5, grid=(2, 3), blur_kernel_size=5), ValueError, "too large"),
    ],
)
def test_bad_inputs_through_the_public_op(kwargs, error, message):
    with pytest.raises(error, match=message):
        top_tau(**kwargs)


def _forward(ext, logits=None, k=None, k_max=1, valid=None, kernel=None, grid=(0, 0)):
    logits = torch.randn(2, 6) if logits is None else logits
    k = torch.ones(logits.shape[0], dtype=torch.int64) if k is None else k
    return ext.top_tau_forward(logits, k, k_max, valid, True, kernel, *grid)


def _backward(ext, attention=None, lam=None, grad_attention=None, kernel=None):
    attention = torch.rand(2, 6) if attention is None else attention
    lam = torch.zeros(2) if lam is None else lam
    mask = torch.zeros(2, 6, dtype=torch.bool)
    return ext.top_tau_backward(attention, mask, lam, torch.ones(2), grad_attention, kernel, 0, 0)


@needs_cpp
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ext: _forward(ext, logits=torch.randn(2, 6, device="meta")), "CPU tensor"),
        (lambda ext: _forward(ext, k=torch.ones(2, dtype=torch.int32)), "k must be Long"),
        (lambda ext: _forward(ext, k=torch.ones(3, dtype=torch.int64)), "one count per row"),
        (lambda ext: _forward(ext, k_max=7), "k_max must lie in"),
        (lambda ext: _forward(ext, valid=torch.ones(2, 5, dtype=torch.bool)), "shape of logits"),
        (lambda ext: _forward(ext, kernel=torch.ones(2)), "odd length"),
        (lambda ext: _forward(ext, kernel=torch.ones(13)), "too long"),
        (lambda ext: _forward(ext, kernel=torch.ones(3, dtype=torch.float16)), "float32 or float64"),
        (lambda ext: _forward(ext, grid=(4, 4)), "does not hold"),
        (lambda ext: _backward(ext, attention=torch.rand(2, 6).half()), "float32 or float64"),
        (lambda ext: _backward(ext, lam=torch.zeros(3)), "lam must have shape"),
        (lambda ext: _backward(ext, lam=torch.zeros(2).double()), "lam must be Float"),
        (lambda ext: _backward(ext, grad_attention=torch.rand(2, 5)), "shape of attention"),
        (lambda ext: _backward(ext, grad_attention=torch.rand(2, 6, device="meta")), "is on meta"),
    ],
)
def test_bad_inputs_to_the_extension(call, message):
    with pytest.raises(RuntimeError, match=message):
        call(_backends.native_extension())

