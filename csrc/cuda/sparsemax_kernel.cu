// CUDA sparsemax over rows x[rows, n]: one team of threads per row with the row in registers --
// one thread for n <= 32 (SOP's groups: the block's rows staged through shared memory so that global
// memory is read and written in coalesced runs, each thread then reads its own row from there), a
// warp for n <= 1024, a block of 256 or 512 threads up to kSparsemaxRegisterEntries -- running the
// per-row algorithm of csrc/team_rows.h (Michelot's exact iteration, sort-free: one read of the row
// from memory).  Rows of n <= 32 in fp32 / fp16 / bf16 may instead run the warp-rows kernel
// (sparsemax_warp_rows_kernel, issue #46; `warp_rows` of the launcher): both stay, for timing side by side.  Longer rows: a block per row that re-reads the row (from L2) per iteration.
// Backward: (g - mean_S g) on S = {p > 0} by teams of 4 lanes, a warp or a block.  Math in float32
// (float64 for double).
#include <type_traits>
#include <utility>

#include "cuda/cuda_common.cuh"
#include "cuda/teams.cuh"
#include "team_rows.h"

namespace sopfast::cuda {
namespace {

constexpr int64_t kSparsemaxRegisterEntries = 16384;
constexpr int kLongRowThreads = 256;

template <typename Team, int VPT, typename scalar_t>
__global__ void __launch_bounds__(TeamBlock<Team>::threads)
    sparsemax_forward_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ p, int64_t rows, int64_t n) {
  using acc_t = typename AccType<scalar_t>::type;
  constexpr int teams = TeamBlock<Team>::teams;
  const Team team;
  for (int64_t row = int64_t(blockIdx.x) * teams + Team::index_in_block(); row < rows;
       row += int64_t(gridDim.x) * teams) {
    const scalar_t* xr = x + row * n;
    scalar_t* pr = p + row * n;
    sparsemax_team_row<VPT, acc_t>(
        team, n, [xr](int64_t i) { return load_as<acc_t>(xr + i); },
        [pr](int64_t i, acc_t value) { pr[i] = cast_to<scalar_t>(value); });
  }
}

// Rows of n <= kThreadRowEntries, one per thread: the block's kThreadRows rows are copied into
// shared memory (as acc_t, rows kThreadRowStride(n) apart so that the threads' rows fall in distinct
// banks) with coalesced loads, each thread runs its row there, and the results go back coalesced.
constexpr int kThreadRows = kWarpTeamBlock;
constexpr int kThreadRowEntries = 32;
__host__ __device__ constexpr int thread_row_stride(int64_t n) { return static_cast<int>(n) | 1; }

template <int VPT, typename scalar_t>
__global__ void __launch_bounds__(kThreadRows)
    sparsemax_thread_rows_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ p, int64_t rows, int64_t n) {
  using acc_t = typename AccType<scalar_t>::type;
  extern __shared__ __align__(16) unsigned char staged_rows[];
  acc_t* tile = reinterpret_cast<acc_t*>(staged_rows);
  const int stride = thread_row_stride(n);
  const ThreadTeam team;
  for (int64_t first = int64_t(blockIdx.x) * kThreadRows; first < rows; first += int64_t(gridDim.x) * kThreadRows) {
    const int64_t count = (rows - first < kThreadRows ? rows - first : kThreadRows) * n;
    const scalar_t* in = x + first * n;
    for (int64_t e = threadIdx.x; e < count; e += kThreadRows) tile[(e / n) * stride + e % n] = load_as<acc_t>(in + e);
    __syncthreads();
    acc_t* mine = tile + threadIdx.x * stride;
    if (first + threadIdx.x < rows) {
      sparsemax_team_row<VPT, acc_t>(
          team, n, [mine](int64_t i) { return mine[i]; }, [mine](int64_t i, acc_t value) { mine[i] = value; });
    }
    __syncthreads();
    scalar_t* out = p + first * n;
    for (int64_t e = threadIdx.x; e < count; e += kThreadRows) out[e] = cast_to<scalar_t>(tile[(e / n) * stride + e % n]);
    __syncthreads();
  }
}

// 16 bytes of a row: one vector load or store.
template <typename T>
struct alignas(16) Vector16 {
  T v[16 / sizeof(T)];
};

// Rows of exactly N <= kThreadRowEntries entries (N a compile-time constant), the warp-rows kernel: each warp
// owns 32 consecutive rows (32 * N contiguous entries) and runs sparsemax_chunk_rows (csrc/team_rows.h) on
// them -- 16-byte vector loads and stores (`vectors`: both pointers 16-byte aligned; a warp's chunk then is
// too) through the warp's own tile of shared memory, each lane's row in registers, no integer division, no
// runtime-indexed array, __syncwarp only.  A last partial chunk goes entry by entry.
template <int N, typename scalar_t>
__global__ void __launch_bounds__(kWarpTeamBlock) sparsemax_warp_rows_kernel(const scalar_t* __restrict__ x,
                                                                            scalar_t* __restrict__ p, int64_t rows,
                                                                            bool vectors) {
  using acc_t = typename AccType<scalar_t>::type;
  constexpr int kWarps = kWarpTeamBlock / kWarp;
  constexpr int kVec = 16 / sizeof(scalar_t);
  __shared__ acc_t tiles[kWarps][kWarp * chunk_row_stride(N)];
  const WarpTeam<kWarp> warp;
  acc_t* tile = tiles[threadIdx.x / kWarp];
  const int64_t chunks_step = int64_t(gridDim.x) * kWarps * kWarp;
  for (int64_t first = (int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp) * kWarp; first < rows;
       first += chunks_step) {
    const int count = rows - first < kWarp ? static_cast<int>(rows - first) : kWarp;
    const scalar_t* in = x + first * N;
    scalar_t* out = p + first * N;
    if (vectors && count == kWarp) {
      sparsemax_chunk_rows<N, kVec, acc_t>(
          warp, count, tile,
          [in](int q, acc_t(&values)[kVec]) {
            const Vector16<scalar_t> raw = reinterpret_cast<const Vector16<scalar_t>*>(in)[q];
#pragma unroll
            for (int c = 0; c < kVec; ++c) values[c] = load_as<acc_t>(&raw.v[c]);
          },
          [out](int q, const acc_t(&values)[kVec]) {
            Vector16<scalar_t> raw;
#pragma unroll
            for (int c = 0; c < kVec; ++c) raw.v[c] = cast_to<scalar_t>(values[c]);
            reinterpret_cast<Vector16<scalar_t>*>(out)[q] = raw;
          });
    } else {
      sparsemax_chunk_rows<N, 1, acc_t>(
          warp, count, tile, [in](int q, acc_t(&values)[1]) { values[0] = load_as<acc_t>(in + q); },
          [out](int q, const acc_t(&values)[1]) { out[q] = cast_to<scalar_t>(values[0]); });
    }
  }
}

// Rows longer than kSparsemaxRegisterEntries: a block per row, the row re-read per Michelot step.
template <typename scalar_t>
__global__ void __launch_bounds__(kLongRowThreads)
    sparsemax_forward_long_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ p, int64_t rows, int64_t n) {
  using acc_t = typename AccType<scalar_t>::type;
  const BlockTeam<kLongRowThreads> team;
  const acc_t inf = positive_infinity<acc_t>();
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const scalar_t* xr = x + row * n;
    scalar_t* pr = p + row * n;
    acc_t row_max = -inf;
    int n_posinf = 0, n_nan = 0;
    for (int64_t i = threadIdx.x; i < n; i += kLongRowThreads) {
      const acc_t v = load_as<acc_t>(xr + i);
      row_max = v > row_max ? v : row_max;
      n_posinf += v == inf;
      n_nan += v != v;
    }
    row_max = team.max(row_max);
    n_posinf = team.sum(n_posinf);
    n_nan = team.sum(n_nan);
    const bool undefined = n_nan > 0 || row_max == -inf;
    const bool special = n_posinf > 0 || undefined;
    acc_t tau = -1;
    int support = -1;
    while (!special) {
      acc_t sum = 0;
      int count = 0;
      for (int64_t i = threadIdx.x; i < n; i += kLongRowThreads) {
        const acc_t z = load_as<acc_t>(xr + i) - row_max;
        sum += z > tau ? z : acc_t(0);
        count += z > tau;
      }
      sum = team.sum(sum);
      count = team.sum(count);
      if (count == support) break;
      support = count;
      const acc_t next = (sum - acc_t(1)) / acc_t(count);
      tau = next > tau ? next : tau;
    }
    for (int64_t i = threadIdx.x; i < n; i += kLongRowThreads) {
      const acc_t v = load_as<acc_t>(xr + i);
      acc_t out = v - row_max - tau > acc_t(0) ? v - row_max - tau : acc_t(0);
      if (special) out = undefined ? quiet_nan<acc_t>() : (v == inf ? acc_t(1) / acc_t(n_posinf) : acc_t(0));
      pr[i] = cast_to<scalar_t>(out);
    }
  }
}

template <typename Team, typename scalar_t>
__global__ void __launch_bounds__(TeamBlock<Team>::threads)
    sparsemax_backward_kernel(const scalar_t* __restrict__ p, const scalar_t* __restrict__ g,
                              scalar_t* __restrict__ grad_x, int64_t rows, int64_t n) {
  using acc_t = typename AccType<scalar_t>::type;
  constexpr int teams = TeamBlock<Team>::teams;
  const Team team;
  for (int64_t row = int64_t(blockIdx.x) * teams + Team::index_in_block(); row < rows;
       row += int64_t(gridDim.x) * teams) {
    const int64_t base = row * n;
    sparsemax_backward_team_row<acc_t>(
        team, n, [p, base](int64_t i) { return load_as<acc_t>(p + base + i); },
        [g, base](int64_t i) { return load_as<acc_t>(g + base + i); },
        [grad_x, base](int64_t i, acc_t value) { grad_x[base + i] = cast_to<scalar_t>(value); });
  }
}

template <typename Team, int VPT, typename scalar_t>
int launch_forward(const scalar_t* x, scalar_t* p, int64_t rows, int64_t n, cudaStream_t stream) {
  using Block = TeamBlock<Team>;
  sparsemax_forward_kernel<Team, VPT, scalar_t>
      <<<grid_for(rows, Block::teams), Block::threads, 0, stream>>>(x, p, rows, n);
  return static_cast<int>(cudaGetLastError());
}

template <int VPT, typename scalar_t>
int launch_thread_rows(const scalar_t* x, scalar_t* p, int64_t rows, int64_t n, cudaStream_t stream) {
  using acc_t = typename AccType<scalar_t>::type;
  const size_t shared = static_cast<size_t>(kThreadRows) * thread_row_stride(n) * sizeof(acc_t);
  sparsemax_thread_rows_kernel<VPT, scalar_t>
      <<<grid_for(rows, kThreadRows), kThreadRows, shared, stream>>>(x, p, rows, n);
  return static_cast<int>(cudaGetLastError());
}

// The warp-rows kernel for the row length n, one of Ns + 1 (1 .. kThreadRowEntries).
template <typename scalar_t, int... Ns>
int launch_warp_rows(const scalar_t* x, scalar_t* p, int64_t rows, int64_t n, cudaStream_t stream,
                     std::integer_sequence<int, Ns...>) {
  const bool vectors = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  int code = static_cast<int>(cudaErrorInvalidValue);
  const unsigned blocks = grid_for(rows, kWarpTeamBlock);  // a row per thread
  const bool launched = ((n == Ns + 1 ? (sparsemax_warp_rows_kernel<Ns + 1, scalar_t>
                                         <<<blocks, kWarpTeamBlock, 0, stream>>>(x, p, rows, vectors),
                                         code = static_cast<int>(cudaGetLastError()), true)
                                      : false) ||
                         ...);
  return launched ? code : static_cast<int>(cudaErrorInvalidValue);
}

template <typename scalar_t>
int launch_sparsemax_forward(const scalar_t* x, scalar_t* p, int64_t rows, int64_t n, bool warp_rows,
                             cudaStream_t stream) {
  using W32 = WarpTeam<32>;
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (warp_rows && n <= kThreadRowEntries) {
      return launch_warp_rows(x, p, rows, n, stream, std::make_integer_sequence<int, kThreadRowEntries>{});
    }
  }
  if (n <= 8) return launch_thread_rows<8>(x, p, rows, n, stream);
  if (n <= 16) return launch_thread_rows<16>(x, p, rows, n, stream);
  if (n <= kThreadRowEntries) return launch_thread_rows<kThreadRowEntries>(x, p, rows, n, stream);
  if (n <= 64) return launch_forward<W32, 2>(x, p, rows, n, stream);
  if (n <= 128) return launch_forward<W32, 4>(x, p, rows, n, stream);
  if (n <= 256) return launch_forward<W32, 8>(x, p, rows, n, stream);
  if (n <= 512) return launch_forward<W32, 16>(x, p, rows, n, stream);
  if (n <= 1024) return launch_forward<W32, 32>(x, p, rows, n, stream);
  if (n <= 2048) return launch_forward<BlockTeam<256>, 8>(x, p, rows, n, stream);
  if (n <= 8192) return launch_forward<BlockTeam<256>, 32>(x, p, rows, n, stream);
  if (n <= kSparsemaxRegisterEntries) return launch_forward<BlockTeam<512>, 32>(x, p, rows, n, stream);
  sparsemax_forward_long_kernel<scalar_t><<<grid_for(rows, 1), kLongRowThreads, 0, stream>>>(x, p, rows, n);
  return static_cast<int>(cudaGetLastError());
}

template <typename Team, typename scalar_t>
int launch_backward(const scalar_t* p, const scalar_t* g, scalar_t* out, int64_t rows, int64_t n, cudaStream_t s) {
  using Block = TeamBlock<Team>;
  sparsemax_backward_kernel<Team, scalar_t><<<grid_for(rows, Block::teams), Block::threads, 0, s>>>(p, g, out, rows, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int sparsemax_forward_launch(const void* x, void* p, int64_t rows, int64_t n, FloatType dtype, bool warp_rows,
                             void* stream) {
  if (rows == 0 || n == 0) return 0;
  return dispatch_float_type(dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    return launch_sparsemax_forward(static_cast<const scalar_t*>(x), static_cast<scalar_t*>(p), rows, n, warp_rows,
                                    static_cast<cudaStream_t>(stream));
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
    if (n <= 32) return launch_backward<WarpTeam<4>>(p_ptr, g_ptr, out_ptr, rows, n, s);
    if (n <= 1024) return launch_backward<WarpTeam<32>>(p_ptr, g_ptr, out_ptr, rows, n, s);
    return launch_backward<BlockTeam<256>>(p_ptr, g_ptr, out_ptr, rows, n, s);
  });
}

}  // namespace sopfast::cuda
