"""gather_tokens: every native backend (C++, CUDA on a GPU, Triton) against the PyTorch
reference, scatter-add backward, adjointness, edge cases and bad inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from op_testing import NATIVE, native, needs_cpp
from sopfast.ops import gather_tokens, gather_tokens_backward_reference, gather_tokens_reference

try:  # the Triton kernels' slot numbering, run in a one-program kernel (Triton is optional)
    import triton
    import triton.language as tl

    from sop_kernels.gather_tokens import _gather_tokens_slots

    @triton.jit
    def store_slots(out_ptr, program, TOKENS: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, TOKENS), _gather_tokens_slots(program, TOKENS))

except ImportError:
    store_slots = None

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


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("prefix", "embed"), [(0, 16), (1, 768), (3, 5)])
def test_forward_matches_reference(backend, device, dtype, prefix, embed):
    x = torch.randn(3, 11, embed).to(device=device, dtype=dtype)
    indices = random_indices(3, 4, 6, 11, seed=embed, device=device)
    out = native("gather_tokens_forward", backend)(x, indices, prefix)
    assert torch.equal(out.cpu(), gather_tokens_reference(x, indices, prefix).cpu())  # a copy: exact


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("prefix", "embed"), [(0, 16), (1, 768), (3, 5)])
def test_backward_matches_reference(backend, device, dtype, prefix, embed):
    indices = random_indices(3, 4, 6, 11, seed=embed, device=device)
    grad = torch.randn(12, prefix + 6, embed).to(device=device, dtype=dtype)
    grad_x = native("gather_tokens_backward", backend)(grad, indices, prefix, 11)
    assert grad_x.dtype == dtype and grad_x.shape == (3, 11, embed)
    expected = gather_tokens_backward_reference(grad.double(), indices, prefix, 11).double()
    torch.testing.assert_close(grad_x.double().cpu(), expected.cpu(), atol=BACKWARD_ATOL[dtype], rtol=1e-3)


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


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_double_backward(backend, device, use_backend):
    """The scatter-add is linear in the incoming gradient: its backward is the gather again."""
    use_backend(backend)
    x = torch.randn(2, 6, 3, dtype=torch.float64, device=device, requires_grad=True)
    indices = random_indices(2, 2, 3, 6, seed=6, device=device)
    assert torch.autograd.gradgradcheck(lambda t: gather_tokens(t, indices, prefix=1).square(), (x,))


@pytest.mark.skipif(store_slots is None, reason="needs Triton")
def test_triton_slots_are_int64_past_2_to_the_31():
    """Output slot numbers are int64: program 2**30 of 4 slots each starts at slot 2**32 (int32 wraps)."""
    out = torch.empty(4, dtype=torch.int64)
    store_slots[(1,)](out, 2**30, TOKENS=4)
    assert out.tolist() == [2**32, 2**32 + 1, 2**32 + 2, 2**32 + 3]


def test_triton_indices_outside_the_tokens_read_nothing():
    """The op checks the range; the kernel itself treats an index >= T like padding (no stray read)."""
    kernels = pytest.importorskip("sop_kernels.gather_tokens")
    x = torch.randn(1, 4, 8)
    indices = torch.tensor([[[1, 4, 2**40]]])
    out = kernels.gather_tokens_forward(x, indices, 1)
    assert torch.equal(out[0, 1], x[0, 1]) and (out[0, 2:] == 0).all()


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_padding_gives_zero_rows_and_no_gradient(backend, device, use_backend):
    use_backend(backend)
    x = torch.randn(1, 5, 4, device=device, requires_grad=True)
    indices = torch.tensor([[[2, -1, 4], [-1, -1, -1]]], device=device)
    out = gather_tokens(x, indices, prefix=1)
    assert torch.equal(out[0, 1], x[0, 2]) and (out[0, 2] == 0).all() and (out[1, 1:] == 0).all()
    assert torch.equal(out[1, 0], x[0, 0])  # the prefix is kept by every group
    out.sum().backward()
    assert x.grad[0, :, 0].tolist() == [2.0, 0.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_repeated_indices_accumulate_and_unread_tokens_are_zero(backend, device, use_backend):
    use_backend(backend)
    x = torch.randn(1, 3, 2, device=device, requires_grad=True)
    gather_tokens(x, torch.tensor([[[1, 1], [1, 0]]], device=device)).sum().backward()
    assert x.grad[0, :, 0].tolist() == [1.0, 3.0, 0.0]
    wide = torch.randn(1, 4, 300, device=device)  # E > one channel block of the Triton kernel
    indices = torch.tensor([[[2, 2, -1], [2, 0, -1]]], device=device)
    grad_x = native("gather_tokens_backward", backend)(torch.ones(2, 4, 300, device=device), indices, 1, 4)
    assert grad_x[0, :, 0].tolist() == [3.0, 0.0, 3.0, 0.0]  # token 0: prefix twice + once; 1, 3: unread
    out = native("gather_tokens_forward", backend)(wide, indices, 1)
    assert torch.equal(out.cpu(), gather_tokens_reference(wide, indices, 1).cpu())


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize(("b", "m", "k", "prefix"), [(0, 3, 4, 1), (2, 0, 4, 1), (2, 3, 0, 0), (2, 3, 0, 2)])
def test_empty_shapes(backend, device, b, m, k, prefix, use_backend):
    use_backend(backend)
    x = torch.randn(b, 6, 4, device=device, requires_grad=True)
    indices = torch.zeros(b, m, k, dtype=torch.int64, device=device)
    out = gather_tokens(x, indices, prefix=prefix)
    torch.testing.assert_close(out, gather_tokens_reference(x.detach(), indices, prefix))
    out.sum().backward()
    assert x.grad.shape == x.shape
    torch.testing.assert_close(x.grad, gather_tokens_backward_reference(torch.ones_like(out), indices, prefix, 6))


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_non_contiguous_expanded_and_int32_inputs(backend, device, use_backend):
    use_backend(backend)
    base = torch.randn(2, 8, 10, device=device)
    indices = random_indices(2, 3, 4, 10, seed=2, device=device)
    transposed = base.transpose(1, 2)  # [2, 10, 8]
    assert torch.equal(gather_tokens(transposed, indices), gather_tokens_reference(transposed.contiguous(), indices))
    expanded = base[:1].expand(2, 8, 10)
    idx8 = random_indices(2, 3, 4, 8, seed=3, device=device)
    assert torch.equal(gather_tokens(expanded, idx8, prefix=1), gather_tokens_reference(expanded, idx8, 1))
    assert torch.equal(gather_tokens(base, idx8.int()), gather_tokens_reference(base, idx8))
    strided_idx = random_indices(2, 3, 8, 8, seed=4, device=device)[:, :, ::2]
    assert torch.equal(gather_tokens(base, strided_idx), gather_tokens_reference(base, strided_idx.contiguous()))


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
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, e, generator=gen, dtype=torch.float64)
    g = torch.randn(b * m, prefix + k, e, generator=gen, dtype=torch.float64)
    indices = torch.randint(-1, t, (b, m, k), generator=gen)
    lhs = (native("gather_tokens_forward", "cpp")(x, indices, prefix) * g).sum()
    rhs = (x * native("gather_tokens_backward", "cpp")(g, indices, prefix, t)).sum()
    torch.testing.assert_close(lhs, rhs, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: gather_tokens(torch.randn(2, 5), torch.zeros(2, 1, 1, dtype=torch.int64)), ValueError, "3 dim"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, dtype=torch.int64)), ValueError, "3 dim"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.full((2, 1, 1), 5)), ValueError, "must lie in"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.full((2, 1, 1), -2)), ValueError, "must lie in"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(3, 1, 1, dtype=torch.int64)), ValueError, "batch"),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, 1, dtype=torch.int64), 6), ValueError, "prefix"),
        (
            lambda: gather_tokens(torch.ones(2, 5, 3, dtype=torch.int64), torch.zeros(2, 1, 1, dtype=torch.int64)),
            TypeError,
            "float32",
        ),
        (lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, 1)), TypeError, "int64 or int32"),
        (
            lambda: gather_tokens(torch.randn(2, 5, 3), torch.zeros(2, 1, 1, dtype=torch.int64, device="meta")),
            ValueError,
            "one device",
        ),
    ],
)
def test_bad_inputs_through_the_public_op(call, error, message):
    with pytest.raises(error, match=message):
        call()


@needs_cpp
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda f, b: f(torch.randn(2, 5, 3), torch.full((2, 1, 1), 5), 0), ValueError, "must lie in"),
        (
            lambda f, b: f(torch.randn(2, 5, 3), torch.zeros(2, 1, 1, dtype=torch.int32), 0),
            TypeError,
            "indices must be Long",
        ),
        (
            lambda f, b: f(torch.randn(2, 5, 3, device="meta"), torch.zeros(2, 1, 1).long(), 0),
            ValueError,
            "CPU tensor",
        ),
        (lambda f, b: f(torch.randn(2, 5, 3), torch.zeros(2, 1, 1).long(), 9), ValueError, "prefix"),
        (lambda f, b: b(torch.randn(2, 3, 4), torch.zeros(2, 1, 2).long(), 0, 5), ValueError, "shape"),
        (lambda f, b: b(torch.randn(2, 2, 4), torch.full((2, 1, 2), 7), 0, 5), ValueError, "must lie in"),
        (
            lambda f, b: b(torch.randn(2, 2, 4), torch.zeros(2, 1, 2, device="meta").long(), 0, 5),
            ValueError,
            "is on meta",
        ),
    ],
)
def test_bad_inputs_to_the_extension(call, error, message):
    with pytest.raises(error, match=message):
        call(native("gather_tokens_forward", "cpp"), native("gather_tokens_backward", "cpp"))
