"""top_tau: every native backend (C++, CUDA on a GPU, Triton) against the PyTorch reference —
masks and indices bit for bit, lam and attention to fp32 rounding — plus autograd, edge cases,
properties of lam and bad inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from op_testing import NATIVE, native, needs_cpp
from sopfast.ops import gaussian_kernel1d, top_tau, top_tau_backward_reference, top_tau_reference

# NaN/inf rows are part of the contract; Triton's interpreter (numpy) reports them as warnings.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")

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
    assert torch.equal(result.mask.cpu(), expected.mask.cpu())
    assert torch.equal(result.indices.cpu(), expected.indices.cpu())
    assert result.lam.dtype == expected.lam.dtype and result.attention.dtype == expected.attention.dtype
    torch.testing.assert_close(result.lam.cpu(), expected.lam.cpu(), atol=atol, rtol=0, equal_nan=True)
    torch.testing.assert_close(result.attention.cpu(), expected.attention.cpu(), atol=atol, rtol=0, equal_nan=True)


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


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_k_bounds_and_ties(backend, device, k, largest, use_backend):
    equal = torch.full((2, 7), 0.5, device=device)
    tied = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, -1.0, 3.0]] * 2, device=device)
    for logits in (equal, tied):
        result = run_top_tau(use_backend, backend, logits, k=k, largest=largest)
        assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=k, largest=largest), 1e-6)
    # all equal: the lowest indices win, whichever end is kept
    indices = run_top_tau(use_backend, backend, equal, k=k, largest=largest).indices[0]
    assert indices.tolist() == list(range(k))


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_ties_go_to_the_lower_index(backend, device, use_backend):
    tied = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]], device=device)
    assert run_top_tau(use_backend, backend, tied, k=2).indices.tolist() == [[1, 2]]
    assert run_top_tau(use_backend, backend, tied, k=2, largest=False).indices.tolist() == [[0, 3]]
    logits = torch.tensor(
        [[0.0] * 8, [1.0, 2.0, 2.0, 1.0, 2.0, 0.0, 2.0, 1.0], [-0.0, 0.0, -0.0, 0.0, 1.0, 1.0, -1.0, -1.0]],
        device=device,
    )
    assert run_top_tau(use_backend, backend, logits, k=3).indices.tolist() == [[0, 1, 2], [1, 2, 4], [0, 4, 5]]
    k = torch.tensor([3, 2, 3], device=device)
    result = run_top_tau(use_backend, backend, logits, k=k, largest=False)
    assert result.indices.tolist() == [[0, 1, 2], [0, 5, -1], [0, 6, 7]]


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize(
    "row",
    [
        [INF, 0.0, INF, -1.0, 2.0],  # +inf: uniform attention over the +inf entries
        [-INF, 0.0, -INF, 1.0, 2.0],
        [-INF, -INF, 1.0, -INF, -INF],
        [3e38, -3e38, 1e38, 0.0, 2e38],  # huge logits: shifted by the max
        [1e-40, -1e-40, 0.0, -0.0, 5e-45],  # denormals and signed zeros
    ],
)
@pytest.mark.parametrize("largest", [True, False])
def test_special_values(backend, device, row, largest, use_backend):
    logits = torch.tensor([row], device=device)
    result = run_top_tau(use_backend, backend, logits, k=2, largest=largest)
    assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=2, largest=largest), 1e-6)
    assert torch.isfinite(result.attention).all()


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_k_per_row_and_padding(backend, device, use_backend):
    logits = torch.randn(3, 10, device=device)
    k = torch.tensor([1, 10, 4], device=device)
    result = run_top_tau(use_backend, backend, logits, k=k)
    assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=k), 1e-6)
    assert result.indices.shape == (3, 10)
    assert (result.indices[0, 1:] == -1).all() and (result.indices[1] >= 0).all()
    assert result.lam[1].item() == pytest.approx(1.0)  # k = d keeps all the mass


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("largest", [True, False])
def test_valid_mask_with_per_row_k_pads_indices(backend, device, largest, use_backend):
    valid = torch.rand(5, 40, generator=torch.Generator().manual_seed(23)) > 0.4
    valid[4] = False
    valid[4, 17] = True  # a single valid feature
    valid = valid.to(device)
    k = torch.minimum(valid.sum(dim=1), torch.tensor([1, 12, 30, 3, 1], device=device))
    logits = torch.randn(5, 40, device=device)
    result = run_top_tau(use_backend, backend, logits, k=k, valid=valid, largest=largest)
    assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=k, valid=valid, largest=largest), 1e-6)
    assert not bool((result.mask & ~valid).any())
    k_max = result.indices.shape[1]
    for row, kept in zip(result.indices.tolist(), k.tolist()):
        assert row[kept:] == [-1] * (k_max - kept)
        assert row[:kept] == sorted(row[:kept]) and min(row[:kept]) >= 0
    assert result.indices[4].tolist() == [17] + [-1] * (k_max - 1)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_bf16_quantised_ties(backend, device, use_backend):
    logits = (torch.randn(4, 100, generator=torch.Generator().manual_seed(25)) * 0.05).to(device, torch.bfloat16)
    k = torch.tensor([10, 50, 99, 1], device=device)
    for largest in (True, False):
        result = run_top_tau(use_backend, backend, logits, k=k, largest=largest)
        assert_same_result(result, run_top_tau(use_backend, "torch", logits, k=k, largest=largest), 2e-6)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_empty_batch_and_single_row(backend, device, use_backend):
    empty = run_top_tau(use_backend, backend, torch.empty(0, 10, device=device), tau=0.3)
    assert empty.indices.shape == (0, 3) and empty.mask.shape == (0, 10)
    assert empty.lam.shape == (0,) and empty.attention.shape == (0, 10)
    grad = native("top_tau_backward", backend)(empty.attention, empty.mask, empty.lam, empty.lam, None, None, 0, 0)
    assert grad.shape == (0, 10)
    one = torch.randn(1, 30, device=device)
    assert_same_result(
        run_top_tau(use_backend, backend, one, tau=0.5), run_top_tau(use_backend, "torch", one, tau=0.5), 1e-6
    )
    for k in (1, 30):  # k = 1 and k = d
        result = run_top_tau(use_backend, backend, one, k=k)
        assert_same_result(result, run_top_tau(use_backend, "torch", one, k=k), 1e-6)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_grad_attention", [False, True])
def test_backward_kernel_matches_reference(backend, device, dtype, with_grad_attention):
    """The backward kernel alone, on the reference's forward outputs (fp64: blur in fp64 too)."""
    gen = torch.Generator().manual_seed(22)
    logits = torch.randn(3, 24, generator=gen, dtype=dtype).to(device)
    blur = gaussian_kernel1d(3, 0.7, device).to(dtype)
    k = torch.tensor([5, 3, 24], device=device)
    expected = top_tau_reference(logits, k, 24, None, True, blur, 4, 6)
    grad_lam = torch.randn(3, generator=gen, dtype=dtype).to(device)
    grad_attention = torch.randn(3, 24, generator=gen, dtype=dtype).to(device) if with_grad_attention else None
    args = (expected.attention, expected.mask, expected.lam, grad_lam, grad_attention, blur, 4, 6)
    grad = native("top_tau_backward", backend)(*args)
    assert grad.dtype == dtype
    atol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(grad.cpu(), top_tau_backward_reference(*args).cpu(), atol=atol, rtol=1e-5)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_non_contiguous_and_expanded_logits(backend, device, use_backend):
    base = torch.randn(20, 8, device=device)
    for logits in (base.t(), base.t()[:1].expand(6, 20), torch.randn(5, 40, device=device)[:, ::2]):
        assert not logits.is_contiguous()
        assert_same_result(
            run_top_tau(use_backend, backend, logits, tau=0.3, blur_kernel_size=3),
            run_top_tau(use_backend, "torch", logits.contiguous(), tau=0.3, blur_kernel_size=3),
            1e-6,
        )


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
    indices, mask, lam, attention = native("top_tau_forward", "cpp")(
        logits, k, int(k[0]), None, largest, False, None, 0, 0
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
        (
            dict(logits=torch.randn(2, 5), tau=0.5, valid=torch.ones(2, 5, dtype=torch.bool, device="meta")),
            ValueError,
            "one device",
        ),
        (dict(logits=torch.randn(2, 6), tau=0.5, grid=(2, 2)), ValueError, "cells"),
        (dict(logits=torch.randn(2, 6), tau=0.5, grid=(2, 3), blur_kernel_size=5), ValueError, "too large"),
    ],
)
def test_bad_inputs_through_the_public_op(kwargs, error, message):
    with pytest.raises(error, match=message):
        top_tau(**kwargs)


def _forward(logits=None, k=None, k_max=1, valid=None, kernel=None, grid=(0, 0)):
    logits = torch.randn(2, 6) if logits is None else logits
    k = torch.ones(logits.shape[0], dtype=torch.int64) if k is None else k
    return native("top_tau_forward", "cpp")(logits, k, k_max, valid, True, False, kernel, *grid)


def _backward(attention=None, lam=None, grad_attention=None, kernel=None):
    attention = torch.rand(2, 6) if attention is None else attention
    lam = torch.zeros(2) if lam is None else lam
    mask = torch.zeros(2, 6, dtype=torch.bool)
    return native("top_tau_backward", "cpp")(attention, mask, lam, torch.ones(2), grad_attention, kernel, 0, 0)


@needs_cpp
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _forward(logits=torch.randn(2, 6, device="meta")), "CPU tensor"),
        (lambda: _forward(k=torch.ones(2, dtype=torch.int32)), "k must be Long"),
        (lambda: _forward(k=torch.ones(3, dtype=torch.int64)), "one count per row"),
        (lambda: _forward(k_max=7), "k_max must lie in"),
        (lambda: _forward(valid=torch.ones(2, 5, dtype=torch.bool)), "shape of logits"),
        (lambda: _forward(kernel=torch.ones(2)), "odd length"),
        (lambda: _forward(kernel=torch.ones(13)), "too long"),
        (lambda: _forward(kernel=torch.ones(3, dtype=torch.float16)), "float32 or float64"),
        (lambda: _forward(grid=(4, 4)), "does not hold"),
        (lambda: _backward(attention=torch.rand(2, 6).half()), "float32 or float64"),
        (lambda: _backward(lam=torch.zeros(3)), "lam must have shape"),
        (lambda: _backward(lam=torch.zeros(2).double()), "lam must be Float"),
        (lambda: _backward(grad_attention=torch.rand(2, 5)), "shape of attention"),
        (lambda: _backward(grad_attention=torch.rand(2, 6, device="meta")), "is on meta"),
    ],
)
def test_bad_inputs_to_the_extension(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
