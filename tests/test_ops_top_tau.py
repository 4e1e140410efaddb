"""top_tau: every native backend (C++, CUDA on a GPU, Triton) against the PyTorch reference, for
both tie rules (``ties="authors"``: rank the attention, equal values higher index first when
keeping the largest; ``ties="logits"``: rank the blurred logits, ties to the lower index) — masks
and indices bit for bit, lam and attention to fp32 rounding — plus an independent oracle of the
authors' rule, saturated / uniform / duplicated rows, subnormal attention, exact ``k``, autograd
(double backward included), edge cases, properties of lam and bad inputs."""

from __future__ import annotations

import importlib
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from op_testing import (
    INTERPRETED,
    NATIVE,
    TRITON_DEVICE,
    covering,
    every_case,
    native,
    native_params,
    needs_cpp,
    needs_triton,
)
from sopfast.ops import gaussian_kernel1d, top_tau, top_tau_backward_reference, top_tau_reference
from sopfast.ops.counts import num_kept

# NaN/inf rows are part of the contract; Triton's interpreter (numpy) reports them as warnings.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# lam and attention are computed in fp32 (fp64 for fp64 logits) by both sides: a few roundings apart
ATOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-6, torch.bfloat16: 2e-6}
INF = float("inf")
TIES = ["authors", "logits"]

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
    """``top_tau`` on ``backend``; the logits tie rule unless ``ties=`` is given."""
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


@pytest.mark.parametrize(
    ("backend", "device", "dtype", "shape", "largest", "with_valid", "ties"),
    native_params(
        {"dtype": DTYPES, "shape": list(SHAPES), "largest": [True, False], "with_valid": [False, True], "ties": TIES},
        crossed=("dtype", "ties"),
    ),
)
def test_forward_matches_reference(backend, device, dtype, shape, largest, with_valid, ties, use_backend):
    d, grid, blur = SHAPES[shape]
    n = 24
    logits = torch.randn(n, d, generator=torch.Generator().manual_seed(d)).to(device=device, dtype=dtype)
    kwargs = dict(largest=largest, blur_kernel_size=blur, grid=grid, ties=ties)
    kwargs["valid"] = random_valid(n, d, seed=d, device=device) if with_valid else None
    result = run_top_tau(use_backend, backend, logits, tau=0.2, **kwargs)
    expected = run_top_tau(use_backend, "torch", logits, tau=0.2, **kwargs)
    assert_same_result(result, expected, ATOL[dtype])
    if with_valid:  # per-row k = floor(0.2 * valid count), at least 1
        counts = kwargs["valid"].sum(dim=-1)
        torch.testing.assert_close(result.mask.sum(dim=-1), (counts * 0.2).floor().long().clamp_min(1))


def test_interpreted_cases_cover_every_pair_of_values():
    """The forward grid in Triton's interpreter (``covering``): every pair of values of two factors, every
    (dtype, rule) with every value of the others, in a quarter of the product."""
    factors = {"dtype": DTYPES, "shape": list(SHAPES), "largest": [True, False], "with_valid": [False, True]}
    factors["ties"] = TIES
    cases = covering(factors, crossed=("dtype", "ties"))
    assert len(cases) == len(every_case(factors)) // 4
    for (a, values_a), (b, values_b) in itertools.combinations(factors.items(), 2):
        seen = {(case[a], case[b]) for case in cases}
        assert seen == set(itertools.product(values_a, values_b)), (a, b)
    for shape, largest, with_valid in itertools.product(SHAPES, [True, False], [False, True]):
        for key, value in (("shape", shape), ("largest", largest), ("with_valid", with_valid)):
            seen = {(case["dtype"], case["ties"]) for case in cases if case[key] == value}
            assert seen == set(itertools.product(DTYPES, TIES)), (key, value)


@pytest.mark.parametrize(
    ("backend", "device", "shape", "dtype", "ties"),
    native_params(
        {
            "shape": ["grid14_blur3", "grid14_noblur", "line512_blur5", "grid5x10_blur5"],
            "dtype": [torch.float32, torch.bfloat16],
            "ties": TIES,
        }
    ),
)
def test_backward_matches_reference(backend, device, shape, dtype, ties, use_backend):
    d, grid, blur = SHAPES[shape]
    gen = torch.Generator().manual_seed(d)
    logits = torch.randn(16, d, generator=gen).to(device=device, dtype=dtype)
    w_lam = torch.randn(16, generator=gen).to(device)
    w_att = torch.randn(16, d, generator=gen).to(device)

    def grads(name, use_attention):
        leaf = logits.clone().requires_grad_()
        res = run_top_tau(use_backend, name, leaf, tau=0.25, blur_kernel_size=blur, grid=grid, ties=ties)
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

    # in Triton's interpreter, random projections of the whole Jacobian (fast_mode) instead of its 60 columns
    fast_mode = backend == "triton" and INTERPRETED
    assert torch.autograd.gradcheck(lam_and_attention, (logits,), eps=1e-6, atol=1e-7, fast_mode=fast_mode)


@pytest.mark.parametrize(("backend", "device"), [pytest.param("torch", "cpu", id="torch"), *NATIVE])
@pytest.mark.parametrize(("grid", "blur"), [((3, 4), 3), (None, 0)])
def test_double_backward(backend, device, grid, blur, use_backend):
    """Second derivatives of lam and attention (the backward in differentiable torch ops under
    create_graph, chained through this op's own backward)."""
    use_backend(backend)
    logits = torch.randn(2, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    logits = logits.to(device).requires_grad_()

    def lam_and_attention(x):
        res = top_tau(x, tau=0.3, blur_kernel_size=blur, grid=grid)
        return res.lam, res.attention

    fast_mode = backend == "triton" and INTERPRETED  # random projections, as in test_gradcheck_float64
    assert torch.autograd.gradgradcheck(lam_and_attention, (logits,), eps=1e-6, atol=1e-6, fast_mode=fast_mode)


# ----------------------------------------------------------------------------- the authors' tie rule


def authors_oracle(logits: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    """The authors' ranking, written independently: ``a = softmax(logits)`` in fp32 (fp64 for fp64),
    ``torch.sort(a, stable=True)`` ascending, flipped when keeping the largest, first ``k``: the mask."""
    a = torch.softmax(logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32), dim=-1)
    order = torch.sort(a, dim=-1, stable=True).indices
    if largest:
        order = order.flip(-1)
    return torch.zeros_like(a, dtype=torch.bool).scatter_(-1, order[:, :k], True)


def blurred_2d(logits: torch.Tensor, kernel_size: int, grid: tuple[int, int]) -> torch.Tensor:
    """Reflect-padded separable Gaussian blur by conv2d (independent of sopfast.ops.blur)."""
    kernel = gaussian_kernel1d(kernel_size, 1.0).to(logits.device, torch.float64)
    pad = kernel_size // 2
    image = F.pad(logits.double().reshape(-1, 1, *grid), (pad, pad, pad, pad), mode="reflect")
    image = F.conv2d(F.conv2d(image, kernel.view(1, 1, 1, -1)), kernel.view(1, 1, -1, 1))
    return image.reshape(logits.shape)


def special_rows(case: str, n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if case == "saturated":  # most attention underflows to exactly 0: fewer than k non-zero values
        return torch.randn(n, d, generator=gen) * 1e3
    if case == "uniform":
        return torch.full((n, d), 0.25)
    return torch.randint(-2, 3, (n, d), generator=gen).float()  # exact duplicates


@pytest.mark.parametrize(
    ("backend", "device", "case", "dtype", "largest"),
    native_params({"case": ["saturated", "uniform", "duplicates"], "dtype": DTYPES, "largest": [True, False]}),
)
def test_authors_rule_on_tied_rows(backend, device, case, dtype, largest, use_backend):
    """Saturated, uniform and duplicated rows, blur off / 1-D / 2-D, with and without a valid mask:
    every backend equals the reference for both rules, and the authors' rule equals the oracle."""
    n, grid = 6, (8, 8)
    logits = special_rows(case, n, 64, seed=len(case)).to(device, dtype)
    valid = random_valid(n, 64, seed=3, device=device)
    for blur, blur_grid in [(0, None), (3, None), (3, grid)]:
        for mask in (None, valid):
            for ties in TIES:
                kwargs = dict(tau=0.2, largest=largest, ties=ties, valid=mask, blur_kernel_size=blur, grid=blur_grid)
                result = run_top_tau(use_backend, backend, logits, **kwargs)
                assert_same_result(result, run_top_tau(use_backend, "torch", logits, **kwargs), ATOL[dtype])
    k = num_kept(0.2, 64)
    result = run_top_tau(use_backend, backend, logits, tau=0.2, largest=largest, ties="authors")
    assert torch.equal(result.mask.cpu(), authors_oracle(logits.cpu(), k, largest))
    if case != "duplicates":  # a 2-D blur keeps uniform rows uniform and saturated rows saturated
        result = run_top_tau(
            use_backend, backend, logits, tau=0.2, largest=largest, ties="authors", blur_kernel_size=3, grid=grid
        )
        oracle = authors_oracle(blurred_2d(logits.cpu(), 3, grid).to(dtype), k, largest)
        assert torch.equal(result.mask.cpu(), oracle)


@pytest.mark.parametrize(("backend", "device"), NATIVE)
def test_authors_rule_breaks_ties_by_the_higher_index(backend, device, use_backend):
    saturated = torch.tensor([[0.0, -200.0, -300.0, 5.0, -250.0, -90.0, -1000.0]], device=device)
    # attention [e^-5, 0, 0, ~1, 0, e^-95 (subnormal), 0]: the zeros tie
    assert run_top_tau(use_backend, backend, saturated, k=4, ties="authors").indices.tolist() == [[0, 3, 5, 6]]
    assert run_top_tau(use_backend, backend, saturated, k=4).indices.tolist() == [[0, 1, 3, 5]]
    smallest = run_top_tau(use_backend, backend, saturated, k=2, ties="authors", largest=False)
    assert smallest.indices.tolist() == [[1, 2]]  # deletion: the sort is not flipped, ties to the lower index
    equal = torch.full((1, 7), 0.5, device=device)
    assert run_top_tau(use_backend, backend, equal, k=3, ties="authors").indices.tolist() == [[4, 5, 6]]
    assert run_top_tau(use_backend, backend, equal, k=3, ties="authors", largest=False).indices.tolist() == [[0, 1, 2]]
    with_inf = torch.tensor([[INF, 1.0, INF, 0.0, INF]], device=device)  # uniform over the +inf entries
    assert run_top_tau(use_backend, backend, with_inf, k=2, ties="authors").indices.tolist() == [[2, 4]]
    valid = torch.tensor([[True, False, True, True, False, True, False]], device=device)
    result = run_top_tau(use_backend, backend, saturated, k=3, ties="authors", valid=valid)
    assert result.indices.tolist() == [[0, 3, 5]]  # invalid features are never kept


def subnormal_band_row() -> torch.Tensor:
    """``[0, x_1, …]`` with ``x_j`` in ``[-104, -87]``, where ``exp`` is subnormal in fp32, placed at
    least 0.1 of a subnormal step away from a rounding boundary (so every correct softmax rounds
    them alike); the row sums to exactly 1, so attention = exp(x).  Steps of 0.5 early, then of 0.03
    near the bottom: distinct values and exact ties (several x in one subnormal step)."""
    quantum = 2.0**-149
    candidates = [-87.5 - 0.5 * i for i in range(30)] + [-102.5 + 0.03 * i for i in range(-30, 30)] + [-103.5, -104.5]
    row = [0.0]
    for x in candidates:
        steps = math.exp(x) / quantum
        if abs(steps - math.floor(steps) - 0.5) > 0.1:
            row.append(x)
    return torch.tensor([row])


@pytest.mark.parametrize(("backend", "device"), NATIVE)
@pytest.mark.parametrize("largest", [True, False])
def test_subnormal_attention_is_kept_and_ranked(backend, device, largest, use_backend):
    """In the band [-104, -87] torch's softmax keeps subnormal attention (softmax([0, -90]) = 8.19e-40):
    the kernels keep it too, return it, and rank by it (a flush to 0 would tie the whole band)."""
    logits = subnormal_band_row()
    d = logits.shape[1]
    expected_attention = torch.softmax(logits, dim=-1)
    assert int((expected_attention > 0).sum()) > d // 2 and expected_attention[0, 1] < 1.2e-38
    logits = logits.to(device)
    for k in (5, d // 2, d - 10, d - 2):
        for ties in TIES:
            kwargs = dict(k=k, largest=largest, ties=ties)
            result = run_top_tau(use_backend, backend, logits, **kwargs)
            assert_same_result(result, run_top_tau(use_backend, "torch", logits, **kwargs), 0.0)
        assert torch.equal(result.attention.cpu(), expected_attention)
        authors = run_top_tau(use_backend, backend, logits, k=k, largest=largest, ties="authors")
        assert torch.equal(authors.mask.cpu(), authors_oracle(logits.cpu(), k, largest))


def negative_nan() -> float:
    """A NaN with the sign bit set, as x86 makes for inf − inf."""
    return torch.tensor([0xFFC00000], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


TORCH_SORT = torch.sort


def radix_sort(x: torch.Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """``torch.sort`` as CUDA orders floats (torch 2.11, rows up to 4,096 values): a stable radix sort of
    the raw bits (sign bit flipped for positive values, every bit for negative ones), so that a NaN with
    the sign bit set lies below −inf, and −0 equal to +0.  Other dtypes sort as on the CPU."""
    if not x.is_floating_point():
        return TORCH_SORT(x, dim=dim, descending=descending, stable=stable)
    bits = x.contiguous().view(torch.int64 if x.dtype == torch.float64 else torch.int32)
    largest = torch.iinfo(bits.dtype).max
    key = torch.where(bits < 0, bits ^ largest, bits)  # the unsigned radix order, as signed integers
    key = torch.where(x == 0, torch.zeros_like(key), key)
    order = TORCH_SORT(key, dim=dim, descending=descending, stable=True).indices
    return torch.return_types.sort((x.gather(dim, order), order))


def test_references_rank_nan_alike_under_the_gpu_radix_sort(monkeypatch):
    """Every sort of the references sees NaN canonicalised: the GPU's radix order (emulated) and the CPU's
    comparison sort give one ranking, where on the raw values they differ."""
    from sopfast.model import reference

    top_tau_module = importlib.import_module("sopfast.ops.top_tau")
    nan = float("nan")
    rows = torch.tensor(
        [
            [1.0, negative_nan(), 3.0, nan, -0.0, 0.0, -INF, INF],
            [negative_nan(), 0.25, nan, 0.25, negative_nan(), 0.0, -0.0, 0.5],
        ]
    )
    valid = torch.ones_like(rows, dtype=torch.bool)
    valid[1, 1] = False
    assert not torch.equal(radix_sort(rows, stable=True).indices, TORCH_SORT(rows, stable=True).indices)
    rankings = {}
    for name, sort in (("cpu", TORCH_SORT), ("radix", radix_sort)):
        monkeypatch.setattr(torch, "sort", sort)
        rankings[name] = [
            top_tau_module._ranking(rows, valid, largest, higher_first)
            for largest in (True, False)
            for higher_first in (True, False)
        ] + [reference._authors_order(rows, deletion) for deletion in (True, False)]
        rankings[name] += [reference._logits_order(rows, deletion) for deletion in (True, False)]
    monkeypatch.undo()
    for cpu, radix in zip(rankings["cpu"], rankings["radix"], strict=True):
        assert torch.equal(cpu, radix)


@pytest.mark.parametrize(("backend", "device"), [pytest.param("torch", "cpu", id="torch"), *NATIVE])
@pytest.mark.parametrize("blur", [0, 3])
def test_rows_without_a_result_are_nan_and_empty(backend, device, blur, use_backend):
    """NaN among the valid logits, or every valid logit −inf: NaN λ and attention, an empty group —
    on every backend, while the other rows of the batch are untouched.  A blur mixes neighbours, so
    with blur a NaN where no feature is valid (row 1) leaves the row without a result too."""
    nan = float("nan")
    logits = torch.tensor(
        [
            [1.0, negative_nan(), 3.0, 2.0, 0.0, 1.0],
            [nan, 1.0, 2.0, 3.0, 4.0, 5.0],  # NaN only where not valid: a normal row
            [-INF] * 6,
            [-INF, -INF, 5.0, -INF, -INF, -INF],  # the one finite entry is not valid
            [0.5, 2.0, -1.0, 3.0, 1.0, 0.0],
        ],
        device=device,
    )
    valid = torch.ones_like(logits, dtype=torch.bool)
    valid[1, 0] = valid[3, 2] = False
    kwargs = dict(tau=0.5, valid=valid, blur_kernel_size=blur)
    result = run_top_tau(use_backend, backend, logits, **kwargs)
    undefined = torch.tensor([True, blur > 0, True, True, False])
    assert torch.isnan(result.lam.cpu()).tolist() == undefined.tolist()
    assert torch.isnan(result.attention.cpu()[undefined]).all()
    assert not result.mask.cpu()[undefined].any() and (result.indices.cpu()[undefined] == -1).all()
    clean = run_top_tau(use_backend, backend, logits[~undefined.to(device)], **{**kwargs, "valid": valid[~undefined]})
    assert torch.equal(result.mask[~undefined.to(device)], clean.mask)
    torch.testing.assert_close(result.lam[~undefined.to(device)], clean.lam)


def test_triton_long_rows_run_the_tiled_kernels(monkeypatch, use_backend):
    """Rows longer than MAX_BLOCK are processed TILE features at a time (bounded registers), for both
    rules, with valid masks, blur (1-D and 2-D, as torch ops) and the backward."""
    kernels = pytest.importorskip("sop_kernels.top_tau")
    monkeypatch.setattr(kernels, "MAX_BLOCK", 64)
    monkeypatch.setattr(kernels, "TILE", 32)
    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(4, 150, generator=gen) * torch.tensor([[1.0], [1e3], [5.0], [0.0]])).round()
    valid = random_valid(4, 150, seed=8, device="cpu")
    w_lam, w_att = torch.randn(4, generator=gen), torch.randn(4, 150, generator=gen)
    # every pair of (rule, largest, blur, valid mask) in the interpreter; every combination on a GPU
    blurs = {"none": (0, None), "1-D": (3, None), "2-D": (5, (10, 15))}
    factors = {"ties": TIES, "largest": [True, False], "blur": list(blurs), "with_valid": [False, True]}
    cases = covering(factors) if INTERPRETED else every_case(factors)
    for case in cases:
        blur, grid = blurs[case["blur"]]
        mask = valid if case["with_valid"] else None
        kwargs = dict(
            tau=0.15, largest=case["largest"], ties=case["ties"], valid=mask, blur_kernel_size=blur, grid=grid
        )
        result = run_top_tau(use_backend, "triton", logits, **kwargs)
        assert_same_result(result, run_top_tau(use_backend, "torch", logits, **kwargs), 2e-6)

    def grads(name, kw):
        leaf = logits.clone().requires_grad_()
        res = run_top_tau(use_backend, name, leaf, **kw)
        ((res.lam * w_lam).sum() + (res.attention * w_att).sum()).backward()
        return leaf.grad

    for ties in TIES:
        for largest in (True, False):
            kwargs = dict(tau=0.15, largest=largest, ties=ties, blur_kernel_size=3, grid=(10, 15))
            torch.testing.assert_close(grads("triton", kwargs), grads("torch", kwargs), atol=1e-5, rtol=1e-4)


def test_triton_blurs_with_torch_ops_above_the_gather_block(monkeypatch, use_backend):
    """Rows above MAX_GATHER_BLOCK are blurred by torch ops before the register kernel (and the
    gradient after it): the in-kernel gathers are kept to short rows (issue #24)."""
    kernels = pytest.importorskip("sop_kernels.top_tau")
    monkeypatch.setattr(kernels, "MAX_GATHER_BLOCK", 32)
    gen = torch.Generator().manual_seed(9)
    for d, blur, grid in [(49, 3, (7, 7)), (60, 5, None)]:
        logits = torch.randn(3, d, generator=gen)
        weights = torch.randn(3, generator=gen), torch.randn(3, d, generator=gen)
        for ties in TIES:
            kwargs = dict(tau=0.2, ties=ties, blur_kernel_size=blur, grid=grid)
            result = run_top_tau(use_backend, "triton", logits, **kwargs)
            assert_same_result(result, run_top_tau(use_backend, "torch", logits, **kwargs), 2e-6)
            torch.testing.assert_close(
                weighted_grad(use_backend, "triton", logits, weights, **kwargs),
                weighted_grad(use_backend, "torch", logits, weights, **kwargs),
                atol=1e-5,
                rtol=1e-4,
            )


def weighted_grad(use_backend, backend, logits, weights, **kwargs):
    """d(Σ w_lam·lam + Σ w_att·attention)/d logits on ``backend``."""
    leaf = logits.clone().requires_grad_()
    result = run_top_tau(use_backend, backend, leaf, **kwargs)
    ((result.lam * weights[0]).sum() + (result.attention * weights[1]).sum()).backward()
    return leaf.grad


# (tau, d) where floor(tau * d) in floating point is one short of the decimal product (issue #14)
EXACT_K = [(0.29, 100, 29), (0.57, 100, 57), (0.58, 50, 29), (0.35, 180, 63), (0.41, 300, 123), (0.69, 300, 207)]


@pytest.mark.parametrize(("tau", "d", "k"), EXACT_K)
def test_k_is_floor_of_the_decimal_tau_times_d(tau, d, k, use_backend):
    assert int(tau * d) == k - 1 and num_kept(tau, d) == k
    logits = torch.randn(2, d)
    assert run_top_tau(use_backend, "torch", logits, tau=tau).indices.shape == (2, k)
    valid = torch.ones(2, d + 7, dtype=torch.bool)
    valid[:, d:] = False  # per-row counts d: the per-row path computes the same k
    result = run_top_tau(use_backend, "torch", torch.randn(2, d + 7), tau=tau, valid=valid)
    assert result.mask.sum(dim=-1).tolist() == [k, k]


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


@pytest.mark.parametrize(("backend", "device"), [("torch", "cpu"), *NATIVE])
@pytest.mark.parametrize("shape", ["grid14_blur3", "grid14_noblur", "line512_noblur"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_outputs_keep_the_groups(backend, device, shape, dtype, use_backend):
    """attention=False and int32 indices: the same groups and λ, no attention (the kernels write none),
    int32 indices; rows without a result stay empty; λ's gradient is the full call's."""
    d, grid, blur = SHAPES[shape]
    logits = (torch.randn(5, d) * 3).to(dtype)
    logits[1, 4] = float("nan")
    logits = logits.to(device).requires_grad_()
    kwargs = dict(tau=0.2, grid=grid, blur_kernel_size=blur, ties="authors")
    full = run_top_tau(use_backend, backend, logits, **kwargs)
    lean = run_top_tau(use_backend, backend, logits, attention=False, index_dtype=torch.int32, **kwargs)
    assert lean.attention is None and lean.indices.dtype == torch.int32
    assert torch.equal(lean.indices.long(), full.indices) and torch.equal(lean.mask, full.mask)
    torch.testing.assert_close(lean.lam, full.lam, atol=0, rtol=0, equal_nan=True)
    assert not lean.mask[1].any() and (lean.indices[1] == -1).all()
    weights = torch.randn(5, device=device).masked_fill(full.lam.isnan(), 0)
    (grad_full,) = torch.autograd.grad(full.lam.nan_to_num().mul(weights).sum(), logits)
    (grad_lean,) = torch.autograd.grad(lean.lam.nan_to_num().mul(weights).sum(), logits)
    torch.testing.assert_close(grad_lean, grad_full, atol=0, rtol=0, equal_nan=True)
    with torch.no_grad():
        raw = torch.ops.sopfast.top_tau(logits, None, full.indices.shape[1], None, True, True, None, 0, 0, False, True)
    assert raw[3].shape == (5, 0) and raw[0].dtype == torch.int32


@needs_triton
def test_triton_radix_search_takes_one_to_three_bits_per_reduction(monkeypatch, use_backend):
    """The threshold search decides RADIX_BITS bits per counting reduction (fewer when the packed counts
    would not fit): every width finds the same groups, ties, special rows and long (tiled) rows too."""
    kernels = importlib.import_module("sop_kernels.top_tau")
    logits = torch.randn(6, 196) * 4
    logits[0, :50] = logits[0, 50]  # ties at the threshold
    logits[1, 7] = INF
    logits[2] = torch.randn(196).round()  # many ties
    logits = logits.to(TRITON_DEVICE)
    expected = run_top_tau(use_backend, "torch", logits, tau=0.2, ties="authors")
    # 2^bits - 1 counts of bit_length(d) bits in 63: 7 x 8 at d = 196, 3 x 20 at 10^6, 1 x 24 at 10^7
    assert [kernels.radix_args(d, 3)["RADIX"] for d in (196, 10**6, 10**7)] == [3, 2, 1]
    for bits in (1, 2, 3):
        monkeypatch.setattr(kernels, "RADIX_BITS", bits)
        for max_block in (1024, 64):  # the row kernel, then the tiled one
            monkeypatch.setattr(kernels, "MAX_BLOCK", max_block)
            assert_same_result(run_top_tau(use_backend, "triton", logits, tau=0.2, ties="authors"), expected, 1e-6)


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
        (dict(logits=torch.randn(2, 16), tau=0.5, grid=(-4, -4)), ValueError, "grid sides must be positive"),
        (dict(logits=torch.randn(2, 16), tau=0.5, grid=(4, 4, 1)), ValueError, "two positive integers"),
        (dict(logits=torch.randn(2, 16), tau=0.5, grid=(4.0, 4)), ValueError, "two positive integers"),
        (dict(logits=torch.randn(2, 16), tau=0.5, ties="index"), ValueError, "ties must be one of"),
        (dict(logits=torch.randn(2, 5), tau=0.5, valid=torch.zeros(2, 5, dtype=torch.bool)), ValueError, "every row"),
        (dict(logits=torch.randn(2, 5), k=torch.tensor([1, 0])), ValueError, "k must lie in"),
        (dict(logits=torch.randn(2, 5), tau=0.5, index_dtype=torch.int16), ValueError, "index_dtype must be one of"),
        (dict(logits=torch.randn(2, 5), tau=0.5, attention=1), TypeError, "attention must be True or False"),
    ],
)
@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_bad_inputs_through_the_public_op(kwargs, error, message, backend, use_backend):
    """Validated once, in the op, before dispatch: every backend rejects alike (grid=(-4, -4) too)."""
    use_backend(backend)
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
        (lambda: _forward(k_max=7), r"k_max \(the features a row keeps at most\) must lie in"),
        (lambda: _forward(k=torch.tensor([1, 2])), r"k must lie in \[1, k_max=1\]"),
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
    with pytest.raises((ValueError, TypeError), match=message):
        call()
