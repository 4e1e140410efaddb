"""gather_tokens: the C++ (and, on a GPU, CUDA) kernels against the PyTorch reference,
scatter-add backward, adjointness, edge cases and bad inputs."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from op_testing import NATIVE, needs_cpp
from sopfast.ops import _backends, gather_tokens, gather_tokens_backward_reference, gather_tokens_reference

# the modules (sopfast.ops re-exports functions of the same names)
gather_tokens_module = importlib.import_module("sopfast.ops.gather_tokens")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# backward sums up to m * (prefix + k) rows in fp32 on both sides, in different orders, then
# rounds to the output dtype: a few fp32 roundings, or one rounding of the 16-bit output
BACKWARD_ATOL = {torch.float64: 1e-6, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)

def random_indices(b, m, k, tokens, seed, device="cpu", padding=True):
    gen = torch.Generator().manual_seed(seed)
    low = -1 if padding else 0
    return torch.randint(low, tokens, (b, m, k), generator=gen).to(device)


def native(backend, name):
    ext = _backends.native_extension()
    return getattr(ext, name if backend == "cpp" else f"{name}_cuda")


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("prefix", "embed"), [(0, 16), (1, 768), (3, 5)])
def test_forward_matches_reference(backend, device, dtype, prefix, embed):
    x = torch.randn(3, 11, embed).to(device=device, dtype=dtype)
    indices = random_indices(3, 4, 6, 11, seed=embed, device=device)
    out = native(backend, "gather_tokens_forward")(x, indices, prefix)
    assert torch.equal(out, gather_tokens_reference(x, indices, prefix))  # a copy: exact


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("prefix", "embed"), [(0, 16), (1, 768), (3, 5)])
def test_backward_matches_reference(backend, device, dtype, prefix, embed):
    indices = random_indices(3, 4, 6, 11, seed=embed, device=device)
    grad = torch.randn(12, prefix + 6, embed).to(device=device, dtype=dtype)
    grad_x = native(backend, "gather_tokens_backward")(grad, indices, prefix, 11)
    assert grad_x.dtype == dtype and grad_x.shape == (3, 11, embed)
    expected = gather_tokens_backward_reference(grad.double(), indices, prefix, 11).double()
    torch.testing.assert_close(grad_x.double(), expected, atol=BACKWARD_ATOL[dtype], rtol=1e-3)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_autograd_matches_reference_backend(backend, device, use_backend):
    x = torch.randn(2, 9, 8, device=device)
    indices = random_indices(2, 3, 4, 9, seed=0, device=device)
    weights = torch.randn(6, 5, 8, device=device)

    def grad_of_weighted_sum(name):
        use_backend(name)
        leaf = x.clone().requires_grad_()
        (gather_tokens(leaf, indices, prefix=1) * weights).sum().backward()
        return leaf.grad

    torch.testing.assert_close(grad_of_weighted_sum(backend), grad_of_weighted_sum("torch"), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_gradcheck_float64(backend, device, use_backend):
    use_backend(backend)
    x = torch.randn(2, 7, 3, dtype=torch.float64, device=device, requires_grad=True)
    indices = random_indices(2, 3, 4, 7, seed=1, device=device)
    assert torch.autograd.gradcheck(lambda t: gather_tokens(t, indices, prefix=2), (x,))


@needs_cpp
def test_padding_gives_zero_rows_and_no_gradient(use_backend):
    use_backend("cpp")
    x = torch.randn(1, 5, 4, requires_grad=True)
    indices = torch.tensor([[[2, -1, 4], [-1, -1, -1]]])
    out = gather_tokens(x, indices, prefix=1)
    assert torch.equal(out[0, 1], x[0, 2]) and (out[0, 2] == 0).all() and (out[1, 1:] == 0).all()
    assert torch.equal(out[1, 0], x[0, 0])  # the prefix is kept by every group
    out.sum().backward()
    assert x.grad[0, :, 0].tolist() == [2.0, 0.0, 1.0, 0.0, 1.0]


@needs_cpp
def test_repeated_indices_accumulate(use_backend):
    use_backend("cpp")
    x = torch.randn(1, 3, 2, requires_grad=True)
    gather_tokens(x, torch.tensor([[[1, 1], [1, 0]]])).sum().backward()
    assert x.grad[0, :, 0].tolist() == [1.0, 3.0, 0.0]


@needs_cpp
@pytest.mark.parametrize(("b", "m", "k", "prefix"), [(0, 3, 4, 1), (2, 0, 4, 1), (2, 3, 0, 0), (2, 3, 0, 2)])
def test_empty_shapes(b, m, k, prefix, use_backend):
    use_backend("cpp")
    x = torch.randn(b, 6, 4, requires_grad=True)
    indices = torch.zeros(b, m, k, dtype=torch.int64)
    out = gather_tokens(x, indices, prefix=prefix)
    torch.testing.assert_close(out, gather_tokens_reference(x.detach(), indices, prefix))
    out.sum().backward()
    assert x.grad.shape == x.shape


@needs_cpp
def test_non_contiguous_expanded_and_int32_inputs(use_backend):
    use_backend("cpp")
    base = torch.randn(2, 8, 10)
    indices = random_indices(2, 3, 4, 10, seed=2)
    transposed = base.transpose(1, 2)  # [2, 10, 8]
    assert torch.equal(gather_tokens(transposed, indices), gather_tokens_reference(transposed.contiguous(), indices))
    expanded = base[:1].expand(2, 8, 10)
    idx8 = random_indices(2, 3, 4, 8, seed=3)
    assert torch.equal(gather_tokens(expanded, idx8, prefix=1), gather_tokens_reference(expanded, idx8, 1))
    assert torch.equal(gather_tokens(base, idx8.int()), gather_tokens_reference(base, idx8))
    strided_idx = random_indices(2, 3, 8, 8, seed=4)[:, :, ::2]
    assert torch.equal(gather_tokens(base, strided_idx), gather_tokens_reference(base, strided_idx.contiguous()))


@needs_cpp
def test_cpp_backend_runs_the_extension_not_the_reference(use_backend, monkeypatch):
    use_backend("cpp")

    def fail(*_):
        raise AssertionError("the reference ran")

    monkeypatch.setattr(gather_tokens_module, "gather_tokens_reference", fail)
    monkeypatch.setattr(gather_tokens_module, "gather_tokens_backward_reference", fail)
    x = torch.randn(2, 5, 3, requires_grad=True)
    gather_tokens(x, random_indices(2, 2, 2, 5, seed=5), prefix=1).sum().backward()


@needs_cpp
@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 9),
    m=st.integers(1, 4),
    k=st.integers(0, 6),
    e=st.integers(1, 9),
    data=st.data(),
)
def test_property_gather_and_scatter_are_adjoint(b, t, m, k, e, data):
    prefix = data.draw(st.integers(0, t))
    seed = data.draw(st.integers(0, 2**16))
    ext = _backends.native_extension()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, e, generator=gen, dtype=torch.float64)
    g = torch.randn(b * m, prefix + k, e, generator=gen, dtype=torch.float64)
    indices = torch.randint(-1, t, (b, m, k), generator=gen)
    lhs = (ext.gather_tokens_forward(x, indices, prefix) * g).sum()
    rhs = (x * ext.gather_tokens_backward(g, indices, prefix, t)).sum()
    torch.testing.assert_close(lhs, rhs, atol=1e-10, rtol=1e-10)


@needs_cpp
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: gather_tokens(torch.randn(2, 5), torch.zeros(2, 1, 1, dtype=torch.int64)), ValueError, "3 dim"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, dtype=torch.int64)), ValueError, "3 dim"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.full((2, 1, 1), 5)), ValueError, "must lie in"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.full((2, 1, 1), -2)), ValueError, "must lie in"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(3, 1, 1, dtype=torch.int64)), ValueError, "batch"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, 1, dtype=torch.int64), 6), ValueError,
         "prefix"),
        (lambda: gather_tokens(torch.ones(2, 5, 3, dtype=torch.int64), torch.zeros(2, 1, 1, dtype=torch.int64)),
         TypeError, "float32"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, 1)), TypeError, "int64 or int32"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, 1, dtype=torch.int64, device="meta")),
         ValueError, "one device"),
    ],
)
def test_bad_inputs_through_the_public_op(call, error, message):
    with pytest.raises(error, match=message):
        call()


@needs_cpp
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ext: ext.gather_tokens_forward(torch.randn(2, 5, 3), torch.full((2, 1, 1), 5), 0), "must lie in"),
        (lambda ext: ext.gather_tokens_forward(torch.randn(2, 5, 3), torch.zeros(2, 1, 1, dtype=torch.int32), 0),
         "indices must be Long"),
        (lambda ext: ext.gather_tokens_forward(torch.randn(2, 5, 3, device="meta"), torch.zeros(2, 1, 1).long(), 0),
         "CPU tensor"),
        (lambda ext: ext.gather_tokens_forward(torch.randn(2, 5, 3), torch.zeros(2, 1, 1).long(), 9), "prefix"),
        (lambda ext: ext.gather_tokens_backward(torch.randn(2, 3, 4), torch.zeros(2, 1, 2).long(), 0, 5), "shape"),
        (lambda ext: ext.gather_tokens_backward(torch.randn(2, 2, 4), torch.full((2, 1, 2), 7), 0, 5), "must lie in"),
        (lambda ext: ext.gather_tokens_backward(torch.randn(2, 2, 4), torch.zeros(2, 1, 2, device="meta").long(), 0,
                                                5), "is on meta"),
    ],
)
def test_bad_inputs_to_the_extension(call, message):
    with pytest.raises(RuntimeError, match=message):
        call(_backends.native_extension())
