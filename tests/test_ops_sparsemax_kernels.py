"""The two CUDA sparsemax kernels for rows of up to 32 entries (issue #46), selected by
``SOPFAST_CUDA_SPARSEMAX``: ``thread-rows`` (the default: a block stages 128 rows through shared memory)
and ``warp-rows`` (a warp owns 32 consecutive rows, 16-byte loads, no block barrier).  On a GPU they give
the same bits for every row length, dtype, row count (full and partial chunks of 32 rows) and alignment,
and match the reference; a bad setting is refused by name.  (Without a GPU the per-row code of both runs on
host threads: csrc/tests/test_team_rows.cpp.)"""

from __future__ import annotations

import pytest
import torch

from op_testing import native, needs_cuda
from sopfast.ops import sparsemax_reference

pytestmark = needs_cuda


def run_kernel(x: torch.Tensor, kernel: str, monkeypatch) -> torch.Tensor:
    monkeypatch.setenv("SOPFAST_CUDA_SPARSEMAX", kernel)
    return native("sparsemax_forward", "cuda")(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("rows", [1, 31, 32, 33, 1000])
def test_warp_rows_equal_thread_rows(dtype, rows, monkeypatch):
    gen = torch.Generator().manual_seed(rows)
    for n in range(1, 33):
        x = (torch.randn(rows, n + 1, generator=gen) * 3).to("cuda", dtype)
        x[0, 0] = float("inf") if rows > 1 else x[0, 0]
        for view in (x[:, :n].contiguous(), x.flatten()[1 : 1 + rows * n].view(rows, n)):  # aligned, unaligned
            thread_rows = run_kernel(view, "thread-rows", monkeypatch)
            warp_rows = run_kernel(view, "warp-rows", monkeypatch)
            assert torch.equal(warp_rows.isnan(), thread_rows.isnan())
            assert torch.equal(warp_rows.nan_to_num(), thread_rows.nan_to_num()), (n, rows, dtype)
            expected = sparsemax_reference(view.double()).to(dtype)
            torch.testing.assert_close(warp_rows, expected, atol=1e-5 if dtype != torch.float16 else 2e-3, rtol=1e-2)


def test_a_bad_setting_is_refused(monkeypatch):
    with pytest.raises(RuntimeError, match="SOPFAST_CUDA_SPARSEMAX must be thread-rows or warp-rows"):
        run_kernel(torch.randn(4, 20, device="cuda"), "fast", monkeypatch)
