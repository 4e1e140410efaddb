"""sparsemax: every native backend (C++, CUDA on a GPU, Triton) against the PyTorch reference and
an independent bisection solver; autograd, edge cases, bad inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from op_testing import NATIVE, native, needs_cpp
from sopfast.ops import sparsemax, sparsemax_backward_reference, sparsemax_reference

# NaN/inf rows are part of the contract; Triton's interpreter (numpy) reports them as warnings.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")

# absolute tolerance of the kernels against the reference, per output dtype (probabilities in [0, 1]:
# a few fp32 rounding steps, or one rounding of the 16-bit output)
ATOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
DTYPES = list(ATOL)
INF = float("inf")


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


def assert_close(actual, expected, **tolerance):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=True, **tolerance)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 7, 20, 33, 200, 1000, 1500])
def test_forward_matches_reference(backend, device, dtype, n):
    x = (torch.randn(37, n, generator=torch.Generator().manual_seed(n)) * 3).to(device=device, dtype=dtype)
    assert_close(native("sparsemax_forward", backend)(x), sparsemax_reference(x), atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 20, 1000, 1500])
def test_backward_matches_reference(backend, device, dtype, n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(29, n, generator=gen).to(device=device, dtype=dtype)
    p = sparsemax_reference(x)
    g = torch.randn(29, n, generator=gen).to(device=device, dtype=dtype)
    # the mean over the support is summed in fp32: allow a few units of the gradient's scale
    atol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 4 * ATOL[dtype])
    grad_x = native("sparsemax_backward", backend)(p, g)
    assert grad_x.dtype == dtype
    assert_close(grad_x, sparsemax_backward_reference(p, g), atol=atol, rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("scale", [1e-3, 0.3, 30.0, 1e4])
def test_support_from_all_to_one(backend, device, scale):
    x = (torch.randn(6, 100, generator=torch.Generator().manual_seed(2)) * scale).to(device)
    p = native("sparsemax_forward", backend)(x)
    assert_close(p, sparsemax_reference(x), atol=2e-6, rtol=0)
    assert_close(p.sum(dim=1), torch.ones(6), atol=1e-5, rtol=0)
    support = (p > 0).sum(dim=1)
    if scale == 1e-3:
        assert bool((support == 100).all())
    if scale == 1e4:
        assert bool((support == 1).all())


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_autograd_matches_reference_backend(backend, device, use_backend):
    x = torch.randn(4, 6, 30, device=device)
    weights = torch.randn(4, 6, 30, device=device)

    def grad_of_weighted_sum(name):
        use_backend(name)
        leaf = x.clone().requires_grad_()
        (sparsemax(leaf, dim=1) * weights).sum().backward()
        return leaf.grad

    assert_close(grad_of_weighted_sum(backend), grad_of_weighted_sum("torch"), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_gradcheck_float64(backend, device, use_backend):
    use_backend(backend)
    # well-separated values keep the finite differences away from support changes
    x = (torch.randperm(40, generator=torch.Generator().manual_seed(0)).double() / 17).reshape(5, 8)
    x = x.to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: sparsemax(t, dim=-1), (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ([0.5, 0.5, 0.5, 0.5], [0.25] * 4),  # all equal: uniform
        ([3.0, 3.0, -1.0], [0.5, 0.5, 0.0]),  # a tie on the support
        ([3.0, 3.0, -1.0, 2.5], [0.5, 0.5, 0.0, 0.0]),  # tie at the top
        ([1.0, 0.5, 0.0], [0.75, 0.25, 0.0]),
        ([2.0], [1.0]),  # n = 1
        ([INF, 1.0, INF], [0.5, 0.0, 0.5]),  # +inf: uniform over the +inf entries
        ([1.0, INF, 2.0, INF], [0.0, 0.5, 0.0, 0.5]),
        ([-INF, 0.0, -INF], [0.0, 1.0, 0.0]),
        ([1.0, -INF, 1.0, 0.0], [0.5, 0.0, 0.5, 0.0]),  # -inf entries get 0
        ([1e30, -1e30, 1e30], [0.5, 0.0, 0.5]),  # huge logits: shifted by the max first
        ([3e38, 3e38, 2e38], [0.5, 0.5, 0.0]),
    ],
)
@pytest.mark.parametrize("padding", [0, 60])
def test_edge_rows(backend, device, row, expected, padding, use_backend):
    use_backend(backend)
    x = torch.tensor([row + [-INF] * padding], device=device)  # -inf padding changes nothing
    p = sparsemax(x)
    assert_close(p[:, : len(row)], torch.tensor([expected]))
    assert_close(p, sparsemax_reference(x))


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("row", [[-INF] * 3, [float("nan"), 1.0, 2.0], [INF, float("nan"), 1.0, INF]])
def test_rows_without_a_result_give_nan(backend, device, row, use_backend):
    """A NaN anywhere (even beside +inf) or a row of −inf: NaN everywhere, other rows untouched."""
    use_backend(backend)
    x = torch.tensor([row, [1.0, 0.5] + [-INF] * (len(row) - 2)], device=device)
    p = sparsemax(x)
    assert torch.isnan(p[0]).all()
    assert_close(p[1, :2], torch.tensor([0.75, 0.25]))
    assert torch.isnan(sparsemax(x.t().contiguous(), dim=0)[:, 0]).all()


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_double_backward(backend, device, use_backend):
    """The backward is linear in the incoming gradient: second derivatives are well defined."""
    use_backend(backend)
    # well-separated values, no entry on the threshold (a kink): as in test_gradcheck_float64
    x = (torch.randperm(40, generator=torch.Generator().manual_seed(0)).double() / 17).reshape(5, 8)
    x = x.to(device).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: sparsemax(t, dim=-1).square(), (x,), eps=1e-6, atol=1e-6)


def test_triton_long_rows_run_the_tiled_kernels(monkeypatch):
    """Rows longer than MAX_BLOCK are processed TILE entries at a time (bounded registers)."""
    kernels = pytest.importorskip("sop_kernels.sparsemax")
    monkeypatch.setattr(kernels, "MAX_BLOCK", 64)
    monkeypatch.setattr(kernels, "TILE", 32)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 150, generator=gen) * torch.tensor([[0.01], [1.0], [30.0], [3.0], [3.0]])
    x[3, 7], x[3, 90] = INF, INF  # the mass shared by the +inf entries
    x[4] = -INF
    p = native("sparsemax_forward", "triton")(x)
    assert_close(p, sparsemax_reference(x), atol=2e-6, rtol=0)
    g = torch.randn(5, 150, generator=gen)
    assert_close(kernels.sparsemax_backward(p, g), sparsemax_backward_reference(p, g), atol=1e-5, rtol=0)
    assert_close(native("sparsemax_forward", "triton")(x.double()), sparsemax_reference(x.double()), atol=1e-12, rtol=0)


def test_triton_tiled_kernels_start_from_a_bound_and_accumulate_in_fp32(monkeypatch):
    """The tiled forward's Michelot passes start from the largest tile bracket: exact for rows whose
    support spans tiles, lies in one tile, or is one huge entry (a bound that must not round away);
    the tiled backward sums fp16 gradients in fp32 (in fp16, 8 × 30000 overflows)."""
    kernels = pytest.importorskip("sop_kernels.sparsemax")
    monkeypatch.setattr(kernels, "MAX_BLOCK", 64)
    monkeypatch.setattr(kernels, "TILE", 32)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, 150, generator=gen) * torch.tensor([[0.01], [1.0], [1e29], [3.0], [1.0]])
    x[3] += 1e4  # large offset: the bound is formed relative to the row's maximum
    x[4, 100] = 50.0  # the support is one entry, far from the first tile
    assert_close(kernels.sparsemax_forward(x), sparsemax_reference(x), atol=2e-6, rtol=0)
    p = torch.zeros(2, 150, dtype=torch.float16)
    p[:, 40:48] = 0.125
    g = torch.full((2, 150), 30000.0, dtype=torch.float16)
    g[:, 40] = 29000.0
    out = kernels.sparsemax_backward(p, g)
    assert torch.isfinite(out).all()
    assert_close(out.float(), sparsemax_backward_reference(p.float(), g.float()), atol=1.0, rtol=0)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_huge_half_logits_do_not_overflow(backend, device, use_backend):
    use_backend(backend)
    x = torch.tensor([[60000.0, 59999.5, -60000.0]], dtype=torch.float16, device=device)
    assert_close(sparsemax(x), sparsemax_reference(x))
    assert torch.isfinite(sparsemax(x)).all()


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_empty_batch_single_row_and_n1(backend, device, use_backend):
    use_backend(backend)
    assert sparsemax(torch.empty(0, 5, device=device)).shape == (0, 5)
    assert sparsemax(torch.empty(3, 0, 4, device=device), dim=-1).shape == (3, 0, 4)
    empty = torch.empty(0, 8, device=device)
    assert native("sparsemax_backward", backend)(empty, empty).shape == (0, 8)
    x = torch.randn(1, 9, device=device)
    assert_close(sparsemax(x), sparsemax_reference(x))
    column = torch.randn(4, 1, device=device)
    assert_close(native("sparsemax_forward", backend)(column), torch.ones(4, 1))
    assert_close(native("sparsemax_backward", backend)(torch.ones_like(column), column), torch.zeros(4, 1))


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_non_contiguous_and_expanded_inputs(backend, device, use_backend):
    use_backend(backend)
    base = torch.randn(12, 7, device=device)
    transposed = base.t()  # [7, 12], sparsemax along dim 0 = rows of base
    assert_close(sparsemax(transposed, dim=0), sparsemax_reference(base).t())
    expanded = base[:1].expand(5, 7)
    assert_close(sparsemax(expanded), sparsemax_reference(base[:1]).expand(5, 7))
    strided = torch.randn(6, 20, device=device)[:, ::2]
    assert_close(sparsemax(strided), sparsemax_reference(strided.contiguous()))


@needs_cpp
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40).flatmap(
        lambda n: st.lists(st.lists(st.floats(-50, 50, width=32), min_size=n, max_size=n), min_size=1, max_size=4)
    )
)
def test_property_simplex_projection(rows):
    x = torch.tensor(rows, dtype=torch.float32)
    p = native("sparsemax_forward", "cpp")(x)
    assert (p >= 0).all()
    torch.testing.assert_close(p.double().sum(dim=-1), torch.ones(len(rows), dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(p.double(), project_by_bisection(x), atol=2e-5, rtol=0)


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
        (lambda f, b: f(torch.ones(2, 3, 4)), "2 dimensions"),
        (lambda f, b: f(torch.ones(2, 3, dtype=torch.int32)), "float32, float16"),
        (lambda f, b: f(torch.ones(2, 3, device="meta")), "CPU tensor"),
        (lambda f, b: b(torch.ones(2, 3), torch.ones(2, 3).double()), "must be Double"),
        (lambda f, b: b(torch.ones(2, 3), torch.ones(3, 2)), "shape of p"),
        (lambda f, b: b(torch.ones(2, 3), torch.ones(2, 3, device="meta")), "grad is on meta but p is on cpu"),
    ],
)
def test_bad_inputs_to_the_extension(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(native("sparsemax_forward", "cpp"), native("sparsemax_backward", "cpp"))
