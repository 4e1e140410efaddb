// The CUDA top_tau forward kernel, one team of threads per row (csrc/cuda/top_tau_teams.cuh: a warp
// for rows of up to 1,024 features), one pass over memory, no sorting -- the per-row algorithm of
// csrc/team_rows.h: runs of kRun features per vector load -> blur -> softmax -> early-exit radix
// threshold search on team counts (several bits per count) -> the selection placed by ballots and
// one scan per row.  Math in float32 whatever the storage type of the logits (converted at load),
// float64 for double logits: top_tau_forward.cu instantiates the float32 kernels,
// top_tau_forward_double.cu the float64 ones, so that the two compile in parallel.
#pragma once

#include "cuda/top_tau_teams.cuh"

namespace sopfast::cuda {

int top_tau_forward_double(const TopTauForwardArgs& args, cudaStream_t stream);

namespace {

// n <= kRun logits from position i of a row stored in `dtype` (the same for the whole launch), as
// acc_t: one vector load for an aligned run (16 bytes of float32, 8 of a 16-bit type).
template <typename acc_t>
__device__ __forceinline__ void load_logits(const void* logits, FloatType dtype, int64_t i, int n, acc_t* out);
template <>
__device__ __forceinline__ void load_logits<float>(const void* logits, FloatType dtype, int64_t i, int n, float* out) {
  if (dtype == FloatType::kFloat32) return load_run(static_cast<const float*>(logits) + i, n, out);
  unsigned short bits[kRun] = {};
  load_run(static_cast<const unsigned short*>(logits) + i, n, bits);
  SOPFAST_UNROLL
  for (int c = 0; c < kRun; ++c) {  // kRun trips (team_rows.h, load_run): the arrays stay in registers
    if (c < n) {
      out[c] = dtype == FloatType::kBFloat16 ? __uint_as_float(static_cast<uint32_t>(bits[c]) << 16)
                                             : __half2float(__ushort_as_half(bits[c]));
    }
  }
}
template <>
__device__ __forceinline__ void load_logits<double>(const void* logits, FloatType, int64_t i, int n, double* out) {
  load_run(static_cast<const double*>(logits) + i, n, out);
}

template <typename acc_t>
struct ForwardParams {
  const void* logits;  // [rows, d] in logits_type (double for acc_t = double)
  FloatType logits_type;
  const bool* valid;
  const int64_t* k;  // or nullptr: k_max in every row
  int64_t rows, k_max;
  int d;
  bool largest, ties_authors;
  BlurSpec<acc_t> blur;
  acc_t* scratch;  // [rows, d] or nullptr: the blur buffer in shared memory
  void* indices;  // int64, or int32 when int32_indices
  bool int32_indices;
  bool* mask;
  acc_t* lam;
  acc_t* attention;  // or nullptr
};

template <typename Team, int VPT, bool BLUR, typename acc_t>
__global__ void __launch_bounds__(TeamBlock<Team>::threads) top_tau_forward_kernel(ForwardParams<acc_t> p) {
  constexpr int teams = TeamBlock<Team>::teams;
  const Team team;
  for (int64_t row = int64_t(blockIdx.x) * teams + Team::index_in_block(); row < p.rows;
       row += int64_t(gridDim.x) * teams) {
    const int64_t base = row * p.d;
    TopTauRow<acc_t> r;
    r.d = p.d;
    r.k = p.k == nullptr ? p.k_max : p.k[row];
    r.k_max = p.k_max;
    r.largest = p.largest;
    r.ties_authors = p.ties_authors;
    r.blur = p.blur;
    r.buffer = blur_buffer<acc_t, Team>(p.scratch, row, p.d);
    if (p.int32_indices) {
      r.indices32 = static_cast<int32_t*>(p.indices) + row * p.k_max;
    } else {
      r.indices = static_cast<int64_t*>(p.indices) + row * p.k_max;
    }
    r.mask = p.mask + base;
    r.lam = p.lam + row;
    r.attention = p.attention == nullptr ? nullptr : p.attention + base;
    const bool* valid = p.valid == nullptr ? nullptr : p.valid + base;
    const void* logits = p.logits;
    const FloatType logits_type = p.logits_type;
    top_tau_team_row<VPT, BLUR>(
        team, r,
        [logits, logits_type, base](int j0, int n, acc_t* out) {
          load_logits<acc_t>(logits, logits_type, base + j0, n, out);
        },
        [valid](int j0, int n, bool* out) {
          if (valid == nullptr) {
            SOPFAST_UNROLL
            for (int c = 0; c < kRun; ++c) out[c] = c < n;
          } else {
            load_run(valid + j0, n, out);
          }
        });
  }
}

template <typename acc_t>
int launch_top_tau_forward(const TopTauForwardArgs& args, cudaStream_t stream) {
  const bool blur = args.blur_kernel != nullptr;
  const bool shared_buffer = blur && blur_in_shared_memory(args.d);
  ForwardParams<acc_t> p{args.logits,
                         args.logits_type,
                         args.valid,
                         args.k,
                         args.rows,
                         args.k_max,
                         static_cast<int>(args.d),
                         args.largest,
                         args.ties_authors,
                         blur_spec<acc_t>(args.blur_kernel, args.blur_size, args.grid_h, args.grid_w),
                         shared_buffer ? nullptr : static_cast<acc_t*>(args.scratch),
                         args.indices,
                         args.int32_indices,
                         args.mask,
                         static_cast<acc_t*>(args.lam),
                         static_cast<acc_t*>(args.attention)};
  return dispatch_team(args.d, [&](auto shape) {
    using Team = typename decltype(shape)::Team;
    constexpr int vpt = decltype(shape)::vpt;
    if (!blur) return launch_teams<Team, acc_t>(top_tau_forward_kernel<Team, vpt, false, acc_t>, p, false, stream);
    return launch_teams<Team, acc_t>(top_tau_forward_kernel<Team, vpt, true, acc_t>, p, shared_buffer, stream);
  });
}

}  // namespace
}  // namespace sopfast::cuda
