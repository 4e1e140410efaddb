"""pytest-benchmark: each ``sop_kernels`` Triton kernel vs its PyTorch reference (and entmax for
sparsemax) at SOP shapes, fp32 and bf16.  CUDA only; skipped elsewhere::

    PYTHONPATH=.:python pytest bench/test_bench_triton.py --benchmark-group-by=group

The cases (shapes, inputs, ideal bytes moved) are those of ``bench/gpu_ops_report.py``.  Each
round launches the op ``CALLS_PER_ROUND`` times and synchronises once; ``extra_info`` holds the
time per call and the achieved GB/s (bytes an ideal kernel moves / time per call).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("Triton benchmarks need a CUDA device", allow_module_level=True)
pytest.importorskip("triton")
pytest.importorskip("pytest_benchmark")

sys.path.insert(0, str(Path(__file__).parent))
from gpu_ops_report import case_specs  # noqa: E402

CALLS_PER_ROUND = 10
ROUNDS = 20
CASES = case_specs(["fp32", "bf16"])


@pytest.mark.parametrize("impl", ["triton", "reference", "entmax"])
@pytest.mark.parametrize("case_id, build", CASES, ids=[case_id for case_id, _ in CASES])
def test_bench_triton_kernel(benchmark, case_id, build, impl):
    case = build()
    fn = getattr(case, impl)
    if fn is None:
        pytest.skip(f"no {impl} implementation for {case_id} (entmax covers sparsemax, when installed)")

    def run_round():
        for _ in range(CALLS_PER_ROUND):
            fn()
        torch.cuda.synchronize()

    run_round()  # compile and warm up outside the timed rounds
    benchmark.group = case_id
    benchmark.pedantic(run_round, rounds=ROUNDS, warmup_rounds=1)
    seconds_per_call = benchmark.stats.stats.median / CALLS_PER_ROUND
    benchmark.extra_info.update(
        ms_per_call=seconds_per_call * 1e3,
        bytes_moved=case.bytes_moved,
        gbps=case.bytes_moved / seconds_per_call / 1e9,
    )
