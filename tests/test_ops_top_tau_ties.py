"""top_tau's tie rules are one rule on every backend (issue #46): the reference, the C++ kernels, the CUDA
kernels (on a GPU) and Triton keep the same groups, bit for bit, on rows full of ties — saturated rows,
uniform rows, duplicated values, rows mirrored on the grid (whose blurred values tie or split by one ulp
with the order of the taps), logits at the softmax's underflow cut, subnormal attention.

The oracle here is written independently of sopfast: the blur tap by tap in numpy scalars (each product
and sum rounded on its own, as the kernels do), and the ranking by Python's ``sorted``.  ``ties="authors"``
ranks the blurred logits with one tie class for logits whose exp underflows to 0 (``s − max`` at most the
largest value whose exp rounds to 0), higher index first among equal scores when keeping the largest;
that is the authors' ranking of the fp32 attention wherever their attention values differ.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from op_testing import INTERPRETED, NATIVE, covering, every_case
from sopfast.ops import gaussian_kernel1d, top_tau
from sopfast.ops.counts import num_kept
from sopfast.ops.top_tau import SOFTMAX_ZERO_AT

BACKENDS = [pytest.param("torch", "cpu", id="torch"), *NATIVE]
TIES = ["authors", "logits"]
GRID = (8, 8)
D = GRID[0] * GRID[1]
BLURS = {"none": (0, None), "1-D": (3, None), "2-D": (3, GRID)}


def largest_underflowing(dtype: torch.dtype) -> float:
    """The largest ``x`` of ``dtype`` whose exp rounds to 0: below ``−150·ln 2`` (fp32) or ``−1075·ln 2``
    (fp64), ``exp(x)`` is under half the smallest subnormal.  Derived here from ``math.exp``."""
    np_type = np.float64 if dtype == torch.float64 else np.float32
    tiny_half = 2.0**-1075 if dtype == torch.float64 else 2.0**-150
    x = np_type(-1075 * math.log(2) if dtype == torch.float64 else -150 * math.log(2))
    while math.exp(float(x)) > tiny_half:  # exp(x) rounds up to the smallest subnormal: step down
        x = np.nextafter(x, np_type(-np.inf))
    while math.exp(float(np.nextafter(x, np_type(0)))) <= tiny_half:
        x = np.nextafter(x, np_type(0))
    return float(x)


def tap_blur(row: np.ndarray, kernel: np.ndarray, grid: tuple[int, int] | None) -> np.ndarray:
    """Reflect-padded blur of one row, tap by tap in numpy scalars of the row's dtype: along w, then h."""

    def line(x: np.ndarray) -> np.ndarray:
        n, pad = len(x), len(kernel) // 2
        out = np.empty_like(x)
        for j in range(n):
            acc = x.dtype.type(0)
            for t, weight in enumerate(kernel):
                q = abs(j + t - pad)
                acc = acc + weight * x[q if q < n else 2 * (n - 1) - q]
            out[j] = acc
        return out

    if grid is None:
        return line(row)
    image = np.stack([line(r) for r in row.reshape(grid)])
    return np.stack([line(c) for c in image.T]).T.reshape(-1)


def oracle_mask(logits, valid, largest, ties, blur, grid) -> torch.Tensor:
    """The groups of ``top_tau(logits, tau=0.2, …)`` by the documented rule, computed independently."""
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    rows = logits.cpu().to(compute).numpy()
    kernel = gaussian_kernel1d(blur, 1.0).to(compute).numpy() if blur else None
    cut = largest_underflowing(compute)
    masks = torch.zeros(rows.shape, dtype=torch.bool)
    for r, row in enumerate(rows):
        s = tap_blur(row, kernel, grid) if blur else row
        ok = [True] * len(s) if valid is None else valid[r].tolist()
        if ties == "authors":
            top = max(s[j] for j in range(len(s)) if ok[j])
            s = [-math.inf if s[j] - top <= cut else float(s[j]) for j in range(len(s))]
        sign = -1 if largest else 1
        index_sign = -1 if ties == "authors" and largest else 1
        order = sorted(range(len(s)), key=lambda j: (not ok[j], sign * s[j], index_sign * j))
        masks[r, order[: num_kept(0.2, sum(ok))]] = True
    return masks


def tie_rows(case: str, dtype: torch.dtype, seed: int, n: int = 4) -> torch.Tensor:
    """``[n, 64]`` rows full of ties of one kind."""
    gen = torch.Generator().manual_seed(seed)
    if case == "saturated":  # most attention underflows to exactly 0
        return (torch.randn(n, D, generator=gen) * 1e3).to(dtype)
    if case == "uniform":
        return torch.full((n, D), 0.25, dtype=dtype)
    if case == "duplicates":
        return torch.randint(-2, 3, (n, D), generator=gen).to(dtype)
    if case == "mirrored":  # mirrored along the grid's w: blurred values equal up to the taps' order
        half = torch.randn(n, GRID[0], GRID[1] // 2, generator=gen)
        return torch.cat([half, half.flip(-1)], dim=-1).reshape(n, D).to(dtype)
    if case == "cut":  # logits at the underflow cut and one step above it, and the row's maximum 0
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        cut = torch.tensor(largest_underflowing(compute), dtype=compute)
        choices = torch.stack([cut, torch.nextafter(cut, torch.zeros_like(cut)), cut - 1, cut + 1])
        rows = choices[torch.randint(0, 4, (n, D), generator=gen)]
        rows[:, 0] = 0.0
        return rows.to(dtype)
    # subnormal attention: exp(s - max) at most 2^-146, several logits per subnormal step (and a few at 0)
    rows = -101.0 - 3.0 * torch.rand(n, D, generator=gen)
    rows[:, 0] = 0.0
    return rows.to(dtype)


CASES = ["saturated", "uniform", "duplicates", "mirrored", "cut", "subnormal"]
# the cut needs fp32 or fp64 logits (a bf16 row cannot hold it)
DTYPES = {case: [torch.float32, torch.bfloat16, torch.float64] for case in CASES} | {
    "cut": [torch.float32, torch.float64]
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cut_is_where_exp_underflows(dtype):
    """SOFTMAX_ZERO_AT is the largest value whose exp rounds to 0 (the kernels hold the same constants:
    the backend tests below fail when one differs by one step)."""
    cut = torch.tensor(SOFTMAX_ZERO_AT[dtype], dtype=dtype)
    assert cut.item() == largest_underflowing(dtype)
    above = torch.nextafter(cut, torch.zeros_like(cut))
    assert torch.softmax(torch.stack([torch.zeros_like(cut), cut]), dim=0)[1] == 0
    assert torch.softmax(torch.stack([torch.zeros_like(cut), above]), dim=0)[1] > 0


@pytest.mark.parametrize(("backend", "device"), BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cut_on_every_backend(backend, device, dtype, use_backend):
    """Logits at the cut join the tie class of zeros (highest index first when keeping the largest, lowest
    when keeping the smallest); one step above it they are ranked by value — on every backend."""
    cut = torch.tensor(largest_underflowing(dtype), dtype=dtype)
    above = torch.nextafter(cut, torch.zeros_like(cut)).item()
    row = torch.tensor([[0.0, cut.item(), above, cut.item(), above, cut.item() - 1]], dtype=dtype, device=device)
    use_backend(backend)
    largest = top_tau(row, k=4, ties="authors")
    assert largest.indices.tolist() == [[0, 2, 4, 5]]  # 0, the two values above the cut, the highest zero
    assert top_tau(row, k=4, ties="authors", largest=False).indices.tolist() == [[1, 2, 3, 5]]
    assert top_tau(row, k=2, ties="authors", largest=False).indices.tolist() == [[1, 3]]
    assert largest.attention[0, 1] == 0 and largest.attention[0, 2] > 0  # as the softmax: 0 at the cut only


VARIANTS = {"blur": list(BLURS), "with_valid": [False, True], "ties": TIES}


def tie_params() -> list:
    """(backend, device, case, dtype, largest, variants): on the compiled backends and the reference every
    (case, dtype, largest), each with every variant (blur, valid mask, rule) in one test; in Triton's
    interpreter one variant per test, every pair of values of the six factors (op_testing.covering)."""
    params = []
    for backend in BACKENDS:
        name, device = backend.values
        if name == "triton" and INTERPRETED:
            factors = {"case": CASES, "dtype": DTYPES["saturated"], "largest": [True, False], **VARIANTS}
            cases = [{**c, "variants": [c]} for c in covering(factors)]
        else:
            cases = [
                {"case": case, "dtype": dtype, "largest": largest, "variants": every_case(VARIANTS)}
                for case in CASES
                for dtype in DTYPES[case]
                for largest in (True, False)
            ]
        for c in cases:
            dtype = c["dtype"] if c["dtype"] in DTYPES[c["case"]] else torch.float32
            label = str(dtype).removeprefix("torch.")
            if len(c["variants"]) == 1:
                label += "".join(f"-{c['variants'][0][key]}" for key in VARIANTS)
            params.append(
                pytest.param(
                    name,
                    device,
                    c["case"],
                    dtype,
                    c["largest"],
                    c["variants"],
                    marks=backend.marks,
                    id=f"{c['case']}-{label}-largest={c['largest']}-{name}",
                )
            )
    return params


@pytest.mark.parametrize(("backend", "device", "case", "dtype", "largest", "variants"), tie_params())
def test_tied_rows_keep_the_oracles_groups(backend, device, case, dtype, largest, variants, use_backend):
    """Both rules, blur off / 1-D / 2-D, with and without a valid mask: the groups are the independent
    oracle's, bit for bit (so every backend's are every other's)."""
    logits = tie_rows(case, dtype, seed=len(case))
    valid = torch.rand(logits.shape, generator=torch.Generator().manual_seed(3)) > 0.3
    valid[:, 0] = True
    use_backend(backend)
    for variant in variants:
        blur, grid = BLURS[variant["blur"]]
        mask = valid if variant["with_valid"] else None
        result = top_tau(
            logits.to(device),
            tau=0.2,
            largest=largest,
            ties=variant["ties"],
            valid=None if mask is None else mask.to(device),
            blur_kernel_size=blur,
            grid=grid,
        )
        expected = oracle_mask(logits, mask, largest, variant["ties"], blur, grid)
        assert torch.equal(result.mask.cpu(), expected), variant
        width = result.indices.shape[1]
        padded = [torch.cat([r.nonzero().flatten(), torch.full((width,), -1)])[:width] for r in expected]
        assert torch.equal(result.indices.cpu(), torch.stack(padded)), variant


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("largest", [True, False])
def test_the_authors_order_wherever_their_attention_differs(case, largest):
    """The authors rank the fp32 softmax values (torch.softmax, a stable sort): every kept feature's
    attention is at least every dropped one's (at most, for the smallest), so the groups differ from
    theirs only among equal attention values."""
    dtype = torch.float64 if case == "cut" else torch.float32
    logits = tie_rows(case, dtype, seed=len(case) + 1)
    for blur, grid in BLURS.values():
        mask = oracle_mask(logits, None, largest, "authors", blur, grid)
        kernel = gaussian_kernel1d(blur, 1.0).to(dtype).numpy() if blur else None
        blurred = torch.tensor(np.stack([tap_blur(r, kernel, grid) if blur else r for r in logits.numpy()]))
        a = torch.softmax(blurred, dim=-1)
        kept = torch.where(mask, a, math.inf if largest else -math.inf)
        dropped = torch.where(mask, -math.inf if largest else math.inf, a)
        if largest:
            assert (kept.amin(dim=-1) >= dropped.amax(dim=-1)).all()
        else:
            assert (kept.amax(dim=-1) <= dropped.amin(dim=-1)).all()


def test_the_rules_part_only_among_equal_attention():
    """Where the authors' attention ties while the logits differ (subnormal attention rounded to one
    value), the documented rule ranks the logits: the authors' sort (lower index first when keeping the
    smallest) keeps another feature of the same attention.  Such rows exist — the difference is real, and
    confined to the ties."""
    logits = tie_rows("subnormal", torch.float32, seed=5)
    a = torch.softmax(logits, dim=-1)
    order = torch.sort(a, dim=-1, stable=True).indices
    authors = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order[:, : num_kept(0.2, D)], True)
    ours = oracle_mask(logits, None, False, "authors", 0, None)
    differs = (authors != ours).any(dim=-1)
    assert differs.any()
    for r in differs.nonzero().flatten().tolist():
        changed = a[r][authors[r] != ours[r]]
        assert (changed == changed[0]).all()  # one attention value: a tie the authors break by index
