// CUDA sparsemax over rows x[rows, n]: one warp per row with the row in registers for
// n <= 1024, one block per row otherwise; backward likewise.  Math in float32 (float64 for
// double).  The threshold comes from Michelot's iteration (exact, sort-free, as on the CPU):
// tau <- (sum_{z > tau} z - 1) / #{z > tau} from tau = max - 1 until the support stops shrinking.
#include "cuda/cuda_common.cuh"

namespace sopfast::cuda {
namespace {

constexpr int kBlockRowThreads = 256;  // threads of the one-block-per-row kernels
constexpr int kWarpRowsPerBlock = 4;   // rows per block of the one-warp-per-row kernels

// Whole-row facts deciding how a row is treated (after a team reduction).
template <typename acc_t>
struct RowStats {
  acc_t max;  // largest non-NaN entry
  int n_posinf = 0;
  int has_nan = 0;

  __device__ RowStats() : max(-infinity<acc_t>()) {}
  __device__ void add(acc_t v) {
    max = fmax(max, v);
    n_posinf += (v == infinity<acc_t>());
    has_nan |= (v != v);
  }
  template <int TEAM>
  __device__ void reduce() {
    max = team_allreduce<TEAM>(max, MaxOp{});
    n_posinf = team_allreduce<TEAM>(n_posinf, SumOp{});
    has_nan = team_allreduce<TEAM>(has_nan, SumOp{});
  }
  // Value of entry v when the row is special (+inf present, NaN, or all -inf).
  __device__ acc_t special_value(acc_t v) const {
    if (n_posinf > 0) return v == infinity<acc_t>() ? acc_t(1) / acc_t(n_posinf) : acc_t(0);
    return quiet_nan<acc_t>();
  }
  __device__ bool special() const { return n_posinf > 0 || has_nan || max == -infinity<acc_t>(); }
};

// Michelot's iteration on the shifted row z (max 0); sum_over(tau) returns the team-reduced
// (sum, count) of {z > tau}.  tau never decreases, so the support is nested and it terminates.
template <typename acc_t, typename SumOver>
__device__ acc_t sparsemax_threshold(SumOver sum_over) {
  acc_t tau = -1;
  int size = -1;
  while (true) {
    acc_t sum;
    int count;
    sum_over(tau, &sum, &count);
    if (count == size) return tau;
    size = count;
    tau = fmax(tau, (sum - acc_t(1)) / acc_t(count));
  }
}

// One warp per row; lane l holds entries l, l + 32, ... (VPT of them, n <= 32 * VPT).
template <typename scalar_t, int VPT>
__global__ void sparsemax_forward_warp_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ p, int64_t rows,
                                              int64_t n) {
  using acc_t = typename AccType<scalar_t>::type;
  const int lane = threadIdx.x % kWarp;
  const int64_t first = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / kWarp;
  for (int64_t row = first; row < rows; row += int64_t(gridDim.x) * kWarpRowsPerBlock) {
    const scalar_t* xr = x + row * n;
    scalar_t* pr = p + row * n;
    acc_t z[VPT];
    RowStats<acc_t> stats;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int64_t i = lane + int64_t(v) * kWarp;
      z[v] = i < n ? load_as<acc_t>(xr + i) : -infinity<acc_t>();
      if (i < n) stats.add(z[v]);
    }
    stats.template reduce<kWarp>();
    if (stats.special()) {
#pragma unroll
      for (int v = 0; v < VPT; ++v) {
        const int64_t i = lane + int64_t(v) * kWarp;
        if (i < n) pr[i] = cast_to<scalar_t>(stats.special_value(z[v]));
      }
      continue;
    }
#pragma unroll
    for (int v = 0; v < VPT; ++v) z[v] -= stats.max;
    const acc_t tau = sparsemax_threshold<acc_t>([&](acc_t t, acc_t* sum, int* count) {
      acc_t s = 0;
      int c = 0;
#pragma unroll
      for (int v = 0; v < VPT; ++v) {
        s += z[v] > t ? z[v] : acc_t(0);
        c += z[v] > t;
      }
      *sum = warp_allreduce(s, SumOp{});
      *count = warp_allreduce(c, SumOp{});
    });
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int64_t i = lane + int64_t(v) * kWarp;
      if (i < n) pr[i] = cast_to<scalar_t>(fmax(z[v] - tau, acc_t(0)));
    }
  }
}

// One block per row for long rows; the row is re-read from global memory (L2) per iteration.
template <typename scalar_t>
__global__ void sparsemax_forward_block_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ p, int64_t rows,
                                               int64_t n) {
  using acc_t = typename AccType<scalar_t>::type;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const scalar_t* xr = x + row * n;
    scalar_t* pr = p + row * n;
    RowStats<acc_t> stats;
    for (int64_t i = threadIdx.x; i < n; i += kBlockRowThreads) stats.add(load_as<acc_t>(xr + i));
    stats.template reduce<kBlockRowThreads>();
    if (stats.special()) {
      for (int64_t i = threadIdx.x; i < n; i += kBlockRowThreads) {
        pr[i] = cast_to<scalar_t>(stats.special_value(load_as<acc_t>(xr + i)));
      }
      continue;
    }
    const acc_t tau = sparsemax_threshold<acc_t>([&](acc_t t, acc_t* sum, int* count) {
      acc_t s = 0;
      int c = 0;
      for (int64_t i = threadIdx.x; i < n; i += kBlockRowThreads) {
        const acc_t z = load_as<acc_t>(xr + i) - stats.max;
        s += z > t ? z : acc_t(0);
        c += z > t;
      }
      *sum = block_allreduce<kBlockRowThreads>(s, SumOp{});
      *count = block_allreduce<kBlockRowThreads>(c, SumOp{});
    });
    for (int64_t i = threadIdx.x; i < n; i += kBlockRowThreads) {
      pr[i] = cast_to<scalar_t>(fmax(load_as<acc_t>(xr + i) - stats.max - tau, acc_t(0)));
    }
  }
}

// grad_x = (g - mean_S g) on S = {p > 0}: a team of TEAM threads per row (a warp, or the block).
template <typename scalar_t, int TEAM>
__global__ void sparsemax_backward_kernel(const scalar_t* __restrict__ p, const scalar_t* __restrict__ g,
                                          scalar_t* __restrict__ grad_x, int64_t rows, int64_t n) {
  using acc_t = typename AccType<scalar_t>::type;
  constexpr int teams = TEAM == kWarp ? kWarpRowsPerBlock : 1;
  const int tid = threadIdx.x % TEAM;
  for (int64_t row = int64_t(blockIdx.x) * teams + threadIdx.x / TEAM; row < rows; row += int64_t(gridDim.x) * teams) {
    const int64_t base = row * n;
    acc_t sum = 0;
    int size = 0;
    for (int64_t i = tid; i < n; i += TEAM) {
      const bool in_support = load_as<acc_t>(p + base + i) > acc_t(0);
      sum += in_support ? load_as<acc_t>(g + base + i) : acc_t(0);
      size += in_support;
    }
    sum = team_allreduce<TEAM>(sum, SumOp{});
    size = team_allreduce<TEAM>(size, SumOp{});
    const acc_t mean = sum / acc_t(size > 0 ? size : 1);
    for (int64_t i = tid; i < n; i += TEAM) {
      const bool in_support = load_as<acc_t>(p + base + i) > acc_t(0);
      grad_x[base + i] = cast_to<scalar_t>(in_support ? load_as<acc_t>(g + base + i) - mean : acc_t(0));
    }
  }
}

template <typename scalar_t, int VPT>
void launch_sparsemax_forward_warp(const scalar_t* x, scalar_t* p, int64_t rows, int64_t n, cudaStream_t stream) {
  sparsemax_forward_warp_kernel<scalar_t, VPT>
      <<<grid_for(rows, kWarpRowsPerBlock), kWarp * kWarpRowsPerBlock, 0, stream>>>(x, p, rows, n);
}

template <typename scalar_t>
void launch_sparsemax_forward(const scalar_t* x, scalar_t* p, int64_t rows, int64_t n, cudaStream_t stream) {
  if (n <= 32) return launch_sparsemax_forward_warp<scalar_t, 1>(x, p, rows, n, stream);
  if (n <= 64) return launch_sparsemax_forward_warp<scalar_t, 2>(x, p, rows, n, stream);
  if (n <= 128) return launch_sparsemax_forward_warp<scalar_t, 4>(x, p, rows, n, stream);
  if (n <= 256) return launch_sparsemax_forward_warp<scalar_t, 8>(x, p, rows, n, stream);
  if (n <= 512) return launch_sparsemax_forward_warp<scalar_t, 16>(x, p, rows, n, stream);
  if (n <= 1024) return launch_sparsemax_forward_warp<scalar_t, 32>(x, p, rows, n, stream);
  sparsemax_forward_block_kernel<scalar_t><<<grid_for(rows, 1), kBlockRowThreads, 0, stream>>>(x, p, rows, n);
}

}  // namespace

int sparsemax_forward_launch(const void* x, void* p, int64_t rows, int64_t n, FloatType dtype, void* stream) {
  if (rows == 0 || n == 0) return 0;
  return dispatch_float_type(dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    launch_sparsemax_forward(static_cast<const scalar_t*>(x), static_cast<scalar_t*>(p), rows, n,
                             static_cast<cudaStream_t>(stream));
    return static_cast<int>(cudaGetLastError());
  });
}

int sparsemax_backward_launch(const void* p, const void* grad, void* grad_x, int64_t rows, int64_t n, FloatType dtype,
                              void* stream) {
  if (rows == 0 || n == 0) return 0;
  return dispatch_float_type(dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* p_ptr = static_cast<const scalar_t*>(p);
    const auto* g_ptr = static_cast<const scalar_t*>(grad);
    auto* out_ptr = static_cast<scalar_t*>(grad_x);
    auto s = static_cast<cudaStream_t>(stream);
    if (n <= 1024) {
      sparsemax_backward_kernel<scalar_t, kWarp>
          <<<grid_for(rows, kWarpRowsPerBlock), kWarp * kWarpRowsPerBlock, 0, s>>>(p_ptr, g_ptr, out_ptr, rows, n);
    } else {
      sparsemax_backward_kernel<scalar_t, kBlockRowThreads>
          <<<grid_for(rows, 1), kBlockRowThreads, 0, s>>>(p_ptr, g_ptr, out_ptr, rows, n);
    }
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace sopfast::cuda
