"""sparsemax: the C++ (and, on a GPU, CUDA) kernels against the PyTorch reference and an
independent bisection solver; autograd, edge cases, bad inputs."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from op_testing import NATIVE, needs_cpp
from sopfast.ops import _backends, sparsemax, sparsemax_backward_reference, sparsemax_reference

# the modules (sopfast.ops re-exports functions of the same names)
sparsemax_module = importlib.import_module("sopfast.ops.sparsemax")

# absolute tolerance of the kernels against the reference, per output dtype (probabilities in [0, 1]:
# a few fp32 rounding steps, or one rounding of the 16-bit output)
ATOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
DTYPES = list(ATOL)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)

def project_by_bisection(x: torch.Tensor, steps: int = 200) -> torch.Tensor:
    """Euclidean projection of each row of finite ``x [N, n]`` onto the simplex, found by
    bisecting tau in sum(max(x - tau, 0)) = 1 (float64, no sort)."""
    x = x.double()
    lo = x.amax(dim=-1, keepdim=True) - 1  # sum >= 1 here
    hi = lo + 1  # sum == 0 here
    for _ in range(steps):
        mid = (lo + hi) / 2
        above = (x - mid).clamp_min(0).sum(dim=-1, keepdim=True) >= 1
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return (x - lo).clamp_min(0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 7, 20, 33, 200, 1000, 1500])
def test_forward_matches_reference(backend, device, dtype, n):
    ext = _backends.native_extension()
    forward = ext.sparsemax_forward if backend == "cpp" else ext.sparsemax_forward_cuda
    x = (torch.randn(37, n, generator=torch.Generator().manual_seed(n)) * 3).to(device=device, dtype=dtype)
    torch.testing.assert_close(forward(x), sparsemax_reference(x), atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 20, 1000, 1500])
def test_backward_matches_reference(backend, device, dtype, n):
    ext = _backends.native_extension()
    backward = ext.sparsemax_backward if backend == "cpp" else ext.sparsemax_backward_cuda
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(29, n, generator=gen).to(device=device, dtype=dtype)
    p = sparsemax_reference(x)
    g = torch.randn(29, n, generator=gen).to(device=device, dtype=dtype)
    # the mean over the support is summed in fp32: allow a few units of the gradient's scale
    atol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 4 * ATOL[dtype])
    torch.testing.assert_close(backward(p, g), sparsemax_backward_reference(p, g), atol=atol, rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_autograd_matches_reference_backend(backend, device, use_backend):
    x = torch.randn(4, 6, 30, device=device)
    weights = torch.randn(4, 6, 30, device=device)

    def grad_of_weighted_sum(name):
        use_backend(name)
        leaf = x.clone().requires_grad_()
        (sparsemax(leaf, dim=1) * weights).sum().backward()
        return leaf.grad

    torch.testing.assert_close(grad_of_weighted_sum(backend), grad_of_weighted_sum("torch"), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_gradcheck_float64(backend, device, use_backend):
    use_backend(backend)
    # well-separated values keep the finite differences away from support changes
    x = (torch.randperm(40, generator=torch.Generator().manual_seed(0)).double() / 17).reshape(5, 8)
    x = x.to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: sparsemax(t, dim=-1), (x,), eps=1e-6, atol=1e-7)


@needs_cpp
@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ([0.5, 0.5, 0.5, 0.5], [0.25] * 4),  # all equal: uniform
        ([3.0, 3.0, -1.0], [0.5, 0.5, 0.0]),  # a tie on the support
        ([1.0, 0.5, 0.0], [0.75, 0.25, 0.0]),
        ([2.0], [1.0]),  # n = 1
        ([float("inf"), 1.0, float("inf")], [0.5, 0.0, 0.5]),  # +inf: uniform over the +inf entries
        ([float("-inf"), 0.0, float("-inf")], [0.0, 1.0, 0.0]),
        ([1e30, -1e30, 1e30], [0.5, 0.0, 0.5]),  # huge logits: shifted by the max first
        ([3e38, 3e38, 2e38], [0.5, 0.5, 0.0]),
    ],
)
def test_edge_rows(row, expected, use_backend):
    use_backend("cpp")
    p = sparsemax(torch.tensor([row]))
    torch.testing.assert_close(p, torch.tensor([expected]))
    torch.testing.assert_close(p, sparsemax_reference(torch.tensor([row])))


@needs_cpp
@pytest.mark.parametrize("row", [[float("-inf")] * 3, [float("nan"), 1.0, 2.0]])
def test_rows_without_a_projection_give_nan(row, use_backend):
    use_backend("cpp")
    assert torch.isnan(sparsemax(torch.tensor([row]))).all()


@needs_cpp
def test_huge_half_logits_do_not_overflow(use_backend):
    use_backend("cpp")
    x = torch.tensor([[60000.0, 59999.5, -60000.0]], dtype=torch.float16)
    torch.testing.assert_close(sparsemax(x), sparsemax_reference(x))
    assert torch.isfinite(sparsemax(x)).all()


@needs_cpp
def test_empty_batch_and_single_row(use_backend):
    use_backend("cpp")
    assert sparsemax(torch.empty(0, 5)).shape == (0, 5)
    assert sparsemax(torch.empty(3, 0, 4), dim=-1).shape == (3, 0, 4)
    x = torch.randn(1, 9)
    torch.testing.assert_close(sparsemax(x), sparsemax_reference(x))


@needs_cpp
def test_non_contiguous_and_expanded_inputs(use_backend):
    use_backend("cpp")
    base = torch.randn(12, 7)
    transposed = base.t()  # [7, 12], sparsemax along dim 0 = rows of base
    torch.testing.assert_close(sparsemax(transposed, dim=0), sparsemax_reference(base).t())
    expanded = base[:1].expand(5, 7)
    torch.testing.assert_close(sparsemax(expanded), sparsemax_reference(base[:1]).expand(5, 7))
    strided = torch.randn(6, 20)[:, ::2]
    torch.testing.assert_close(sparsemax(strided), sparsemax_reference(strided.contiguous()))


@needs_cpp
def test_cpp_backend_runs_the_extension_not_the_reference(use_backend, monkeypatch):
    use_backend("cpp")

    def fail(*_):
        raise AssertionError("the reference ran")

    monkeypatch.setattr(sparsemax_module, "sparsemax_reference", fail)
    monkeypatch.setattr(sparsemax_module, "sparsemax_backward_reference", fail)
    x = torch.randn(3, 4, requires_grad=True)
    sparsemax(x).sum().backward()


@needs_cpp
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40).flatmap(
        lambda n: st.lists(st.lists(st.floats(-50, 50, width=32), min_size=n, max_size=n), min_size=1, max_size=4)
    )
)
def test_property_simplex_projection(rows):
    x = torch.tensor(rows, dtype=torch.float32)
    p = _backends.native_extension().sparsemax_forward(x)
    assert (p >= 0).all()
    torch.testing.assert_close(p.double().sum(dim=-1), torch.ones(len(rows), dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(p.double(), project_by_bisection(x), atol=2e-5, rtol=0)


@needs_cpp
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: sparsemax(torch.tensor(1.0)), ValueError, "at least one dimension"),
        (lambda: sparsemax(torch.ones(3, dtype=torch.int64)), TypeError, "float32"),
        (lambda: sparsemax(torch.ones(2, 3), dim=2), ValueError, "dim must be"),
        (lambda: sparsemax([1.0, 2.0]), TypeError, "torch.Tensor"),
    ],
)
def test_bad_inputs_through_the_public_op(call, error, message):
    with pytest.raises(error, match=message):
        call()


@needs_cpp
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ext: ext.sparsemax_forward(torch.ones(2, 3, 4)), "2 dimensions"),
        (lambda ext: ext.sparsemax_forward(torch.ones(2, 3, dtype=torch.int32)), "float32, float16"),
        (lambda ext: ext.sparsemax_forward(torch.ones(2, 3, device="meta")), "CPU tensor"),
        (lambda ext: ext.sparsemax_backward(torch.ones(2, 3), torch.ones(2, 3).double()), "must be Double"),
        (lambda ext: ext.sparsemax_backward(torch.ones(2, 3), torch.ones(3, 2)), "shape of p"),
        (lambda ext: ext.sparsemax_backward(torch.ones(2, 3), torch.ones(2, 3, device="meta")), "CPU tensor"),
    ],
)
def test_bad_inputs_to_the_extension(call, message):
    with pytest.raises(RuntimeError, match=message):
        call(_backends.native_extension())
