"""The Triton kernels of ``sop_kernels`` against the PyTorch references of ``sopfast.ops``.

Without CUDA the kernels run on CPU tensors in Triton's interpreter (set up before anything
imports triton); with CUDA they run compiled on the GPU.  Shapes stay tiny: the interpreter is
slow.  Covers forward and backward of sparsemax, top_tau and gather_tokens in fp32/fp16/bf16
(and fp64), their edge cases, and the public ops routed to Triton with ``SOPFAST_BACKEND``.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("numpy")
pytest.importorskip("triton")

import sop_kernels
from sopfast import ops
from sopfast.ops import _backends
from sopfast.ops.blur import gaussian_kernel1d

# NaN/inf rows are part of the contract; the interpreter's numpy reports them as warnings.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF = float("inf")
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Outputs in the input dtype may differ from the reference by an ulp of that dtype.
TOLERANCE = {
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=1e-5, atol=1e-6),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}
FP32_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def randn(*shape, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def assert_close(actual, expected, **tolerance):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=True, **tolerance)


# ----------------------------------------------------------------------------- sparsemax


def check_sparsemax(x: torch.Tensor) -> None:
    p = sop_kernels.sparsemax_forward(x)
    expected = ops.sparsemax_reference(x)
    assert p.dtype == x.dtype and p.shape == x.shape
    assert_close(p, expected, **TOLERANCE[x.dtype])
    grad = randn(*x.shape, dtype=x.dtype, seed=1)
    grad_x = sop_kernels.sparsemax_backward(expected, grad)
    assert grad_x.dtype == grad.dtype
    assert_close(grad_x, ops.sparsemax_backward_reference(expected, grad), **TOLERANCE[x.dtype])


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, torch.float64])
@pytest.mark.parametrize("n", [1, 7, 20, 130, 1000])
def test_sparsemax_matches_reference(dtype, n):
    check_sparsemax(randn(5, n, dtype=dtype, scale=2.0))


@pytest.mark.parametrize("scale", [1e-3, 0.3, 30.0, 1e4])
def test_sparsemax_support_from_all_to_one(scale):
    x = randn(6, 100, scale=scale, seed=2)
    check_sparsemax(x)
    support = (sop_kernels.sparsemax_forward(x) > 0).sum(dim=1)
    if scale == 1e-3:
        assert bool((support == 100).all())
    if scale == 1e4:
        assert bool((support == 1).all())


def test_sparsemax_rows_sum_to_one():
    p = sop_kernels.sparsemax_forward(randn(9, 33, scale=3.0, seed=3))
    assert_close(p.sum(dim=1), torch.ones(9), **FP32_TOLERANCE)
    assert bool((p >= 0).all())


@pytest.mark.parametrize("padding", [0, 60])
def test_sparsemax_ties_and_infinities(padding):
    x = torch.tensor(
        [
            [1.0, INF, 2.0, INF],  # +inf entries share the mass
            [-INF, -INF, -INF, -INF],  # undefined: NaN
            [0.5, 0.5, 0.5, 0.5],  # all equal: uniform
            [1.0, -INF, 1.0, 0.0],  # -inf entries get 0
            [3.0, 3.0, -1.0, 2.5],  # tie at the top
        ],
        device=DEVICE,
    )
    x = torch.cat([x, torch.full((5, padding), -INF, device=DEVICE)], dim=1)  # -inf padding changes nothing
    p = sop_kernels.sparsemax_forward(x)
    assert_close(p[0, :4], torch.tensor([0.0, 0.5, 0.0, 0.5]))
    assert bool(p[1].isnan().all())
    assert_close(p[2, :4], torch.full((4,), 0.25))
    assert_close(p[4, :4], torch.tensor([0.5, 0.5, 0.0, 0.0]))
    check_sparsemax(x)


def test_sparsemax_single_row_and_empty_batch():
    check_sparsemax(randn(1, 50, seed=4))
    empty = torch.empty(0, 8, device=DEVICE)
    assert sop_kernels.sparsemax_forward(empty).shape == (0, 8)
    assert sop_kernels.sparsemax_backward(empty, empty).shape == (0, 8)


def test_sparsemax_n1_is_one_with_zero_gradient():
    x = randn(4, 1, seed=5)
    assert_close(sop_kernels.sparsemax_forward(x), torch.ones(4, 1))
    assert_close(sop_kernels.sparsemax_backward(torch.ones_like(x), x), torch.zeros(4, 1))


# ----------------------------------------------------------------------------- top_tau


def check_top_tau(logits, k, k_max, valid=None, largest=True, blur=None, grid=(0, 0), grad_attention=True):
    """Kernel forward equals the reference (indices and mask exactly), then the backward too."""
    args = (logits, k, k_max, valid, largest, blur, *grid)
    indices, mask, lam, attention = sop_kernels.top_tau_forward(*args)
    expected = ops.top_tau_reference(*args)
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    assert lam.dtype == attention.dtype == compute
    assert torch.equal(indices.cpu(), expected.indices.cpu())
    assert torch.equal(mask.cpu(), expected.mask.cpu())
    tolerance = TOLERANCE[compute]
    assert_close(attention, expected.attention, **tolerance)
    assert_close(lam, expected.lam, **tolerance)

    n, d = logits.shape
    grad_lam = randn(n, seed=11).to(compute)
    grad_att = randn(n, d, seed=12).to(compute) if grad_attention else None
    backward_args = (expected.attention, expected.mask, expected.lam, grad_lam, grad_att, blur, *grid)
    grad = sop_kernels.top_tau_backward(*backward_args)
    assert grad.dtype == compute
    assert_close(grad, ops.top_tau_backward_reference(*backward_args), **tolerance)
    return indices, mask


def row_k(*values):
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, torch.float64])
@pytest.mark.parametrize("largest", [True, False])
def test_top_tau_matches_reference(dtype, largest):
    check_top_tau(randn(4, 196, dtype=dtype, seed=20), row_k(1, 39, 196, 7), 196, largest=largest)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("grid", [(14, 14), (4, 6), (0, 0)], ids=["2d-14x14", "2d-4x6", "1d"])
@pytest.mark.parametrize("kernel_size", [3, 5])
def test_top_tau_with_blur(dtype, grid, kernel_size):
    d = grid[0] * grid[1] or 50
    blur = gaussian_kernel1d(kernel_size, 1.0, DEVICE)
    check_top_tau(randn(3, d, dtype=dtype, seed=21), row_k(2, d // 5, d), d, blur=blur, grid=grid)


def test_top_tau_blur_in_fp64():
    blur = gaussian_kernel1d(3, 0.7, DEVICE).double()
    check_top_tau(randn(2, 24, dtype=torch.float64, seed=22), row_k(5, 3), 5, blur=blur, grid=(4, 6))


@pytest.mark.parametrize("largest", [True, False])
def test_top_tau_valid_mask_with_per_row_k_pads_indices(largest):
    g = torch.Generator().manual_seed(23)
    valid = (torch.rand(5, 40, generator=g) > 0.4).to(DEVICE)
    valid[4] = False
    valid[4, 17] = True  # a single valid feature
    k = torch.minimum(valid.sum(dim=1), row_k(1, 12, 30, 3, 1))
    indices, mask = check_top_tau(randn(5, 40, seed=24), k, 12, valid=valid, largest=largest)
    assert not bool((mask & ~valid).any())
    for row, kept in zip(indices.tolist(), k.tolist()):
        assert row[kept:] == [-1] * (12 - kept)
        assert row[:kept] == sorted(row[:kept]) and min(row[:kept]) >= 0
    assert indices[4].tolist() == [17] + [-1] * 11


def test_top_tau_ties_go_to_the_lower_index():
    logits = torch.tensor(
        [[0.0] * 8, [1.0, 2.0, 2.0, 1.0, 2.0, 0.0, 2.0, 1.0], [-0.0, 0.0, -0.0, 0.0, 1.0, 1.0, -1.0, -1.0]],
        device=DEVICE,
    )
    indices, _ = check_top_tau(logits, row_k(3, 3, 3), 3)
    assert indices.tolist() == [[0, 1, 2], [1, 2, 4], [0, 4, 5]]
    indices, _ = check_top_tau(logits, row_k(3, 2, 3), 3, largest=False)
    assert indices.tolist() == [[0, 1, 2], [0, 5, -1], [0, 6, 7]]


def test_top_tau_bf16_quantised_ties():
    check_top_tau(randn(4, 100, dtype=torch.bfloat16, scale=0.05, seed=25), row_k(10, 50, 99, 1), 99)


def test_top_tau_infinities():
    logits = torch.tensor(
        [[1.0, INF, 0.0, INF, 2.0], [-INF, 0.5, -INF, -INF, 3.0], [-INF, -INF, 1.0, -INF, -INF]],
        device=DEVICE,
    )
    indices, _ = check_top_tau(logits, row_k(1, 3, 2), 3)
    assert indices.tolist() == [[1, -1, -1], [0, 1, 4], [0, 2, -1]]
    indices, _ = check_top_tau(logits, row_k(2, 2, 5), 5, largest=False)
    assert indices.tolist() == [[0, 2, -1, -1, -1], [0, 2, -1, -1, -1], [0, 1, 2, 3, 4]]


def test_top_tau_single_row_k1_and_kd_without_grad_attention():
    x = randn(1, 512, seed=26)
    check_top_tau(x, row_k(1), 1, grad_attention=False)
    check_top_tau(x, row_k(512), 512, grad_attention=False)


def test_top_tau_empty_batch():
    indices, mask, lam, attention = sop_kernels.top_tau_forward(
        torch.empty(0, 10, device=DEVICE), row_k(), 3, None, True, None, 0, 0
    )
    assert indices.shape == (0, 3) and mask.shape == attention.shape == (0, 10) and lam.shape == (0,)
    empty = torch.empty(0, 10, device=DEVICE)
    grad = sop_kernels.top_tau_backward(empty, mask, lam, lam, None, None, 0, 0)
    assert grad.shape == (0, 10)


# ----------------------------------------------------------------------------- gather_tokens


def token_indices(b, m, k, t, prefix, seed):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(prefix, t, (b, m, k), generator=g)
    indices[0, -1, k // 2 :] = -1  # padded tail
    return indices.to(DEVICE)


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, torch.float64])
@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_gather_tokens_matches_reference(dtype, prefix):
    b, t, e, m, k = 2, 9, 12, 3, 5
    x = randn(b, t, e, dtype=dtype, seed=30)
    indices = token_indices(b, m, k, t, prefix, seed=31)
    out = sop_kernels.gather_tokens_forward(x, indices, prefix)
    assert torch.equal(out.cpu(), ops.gather_tokens_reference(x, indices, prefix).cpu())
    assert bool((out[m - 1, prefix + k // 2 :] == 0).all())

    grad = randn(b * m, prefix + k, e, dtype=dtype, seed=32)
    grad_x = sop_kernels.gather_tokens_backward(grad, indices, prefix, t)
    assert grad_x.dtype == dtype and grad_x.shape == (b, t, e)
    expected = ops.gather_tokens_backward_reference(grad, indices, prefix, t)
    assert_close(grad_x, expected, **TOLERANCE[dtype if dtype != torch.float64 else torch.float32])


def test_gather_tokens_repeated_tokens_accumulate_and_unread_tokens_are_zero():
    x = randn(1, 4, 300, seed=33)  # E > one channel block
    indices = torch.tensor([[[2, 2, -1], [2, 0, -1]]], device=DEVICE)
    grad = torch.ones(2, 4, 300, device=DEVICE)
    grad_x = sop_kernels.gather_tokens_backward(grad, indices, 1, 4)
    assert grad_x[0, :, 0].tolist() == [3.0, 0.0, 3.0, 0.0]  # token 0: prefix twice + once; 1, 3: unread
    assert torch.equal(
        sop_kernels.gather_tokens_forward(x, indices, 1).cpu(), ops.gather_tokens_reference(x, indices, 1).cpu()
    )


def test_gather_tokens_empty_shapes():
    x = randn(2, 5, 4, seed=34)
    no_groups = torch.empty(2, 0, 3, dtype=torch.int64, device=DEVICE)
    assert sop_kernels.gather_tokens_forward(x, no_groups, 1).shape == (0, 4, 4)
    grad_x = sop_kernels.gather_tokens_backward(torch.empty(0, 4, 4, device=DEVICE), no_groups, 1, 5)
    assert_close(grad_x, torch.zeros(2, 5, 4))


# ----------------------------------------------------------------------------- public ops


@pytest.fixture
def triton_backend(monkeypatch):
    monkeypatch.setenv("SOPFAST_BACKEND", "triton")
    _backends.triton_kernels.cache_clear()
    assert _backends.select_backend(torch.empty(1, device=DEVICE)) == "triton"
    yield
    _backends.triton_kernels.cache_clear()


def grads_of(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    loss = sum((o.float() * randn(*o.shape, seed=40 + i)).sum() for i, o in enumerate(out))
    loss.backward()
    return [o.detach() for o in out], [t.grad for t in inputs]


def public_ops_outputs_and_grads():
    x = randn(2, 14, 6, seed=41)
    logits = randn(3, 16, seed=42)
    return {
        "sparsemax": grads_of(lambda v: (ops.sparsemax(v, dim=1),), x),
        "top_tau": grads_of(lambda v: ops.top_tau(v, 0.25, blur_kernel_size=3, grid=(4, 4))[2:], logits),
        "gather_tokens": grads_of(
            lambda v: (ops.gather_tokens(v, token_indices(2, 3, 4, 14, 1, seed=43), prefix=1),), x
        ),
    }


def test_public_ops_through_the_triton_backend(triton_backend, monkeypatch):
    through_triton = public_ops_outputs_and_grads()
    monkeypatch.setenv("SOPFAST_BACKEND", "torch")
    through_torch = public_ops_outputs_and_grads()
    for name, (outputs, grads) in through_triton.items():
        expected_outputs, expected_grads = through_torch[name]
        for actual, expected in zip(outputs + grads, expected_outputs + expected_grads, strict=True):
            assert_close(actual, expected, **FP32_TOLERANCE, msg=name)
