// The CUDA top_tau forward kernel, one team of threads per row (csrc/cuda/top_tau_teams.cuh), one
// pass over memory, no sorting -- the per-row algorithm of csrc/team_rows.h: blur -> softmax ->
// early-exit threshold search on team counts -> the selection placed by ballots and one scan per
// row.  Math in float32 whatever the storage type of the logits (converted at load), float64 for
// double logits: top_tau_forward.cu instantiates the float32 kernels, top_tau_forward_double.cu the
// float64 ones, so that the two compile in parallel.
#pragma once

#include "cuda/top_tau_teams.cuh"

namespace sopfast::cuda {

int top_tau_forward_double(const TopTauForwardArgs& args, cudaStream_t stream);

namespace {

template <typename acc_t>
__device__ __forceinline__ acc_t load_logit(const void* logits, FloatType dtype, int64_t i);
template <>
__device__ __forceinline__ float load_logit<float>(const void* logits, FloatType dtype, int64_t i) {
  return load_float(logits, dtype, i);
}
template <>
__device__ __forceinline__ double load_logit<double>(const void* logits, FloatType, int64_t i) {
  return static_cast<const double*>(logits)[i];
}

template <typename acc_t>
struct ForwardParams {
  const void* logits;  // [rows, d] in logits_type (double for acc_t = double)
  FloatType logits_type;
  const bool* valid;
  const int64_t* k;
  int64_t rows, k_max;
  int d;
  bool largest, ties_authors;
  BlurSpec<acc_t> blur;
  acc_t* scratch;  // [rows, d] or nullptr: the blur buffer in shared memory
  int64_t* indices;
  bool* mask;
  acc_t* lam;
  acc_t* attention;
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
    r.k = p.k[row];
    r.k_max = p.k_max;
    r.largest = p.largest;
    r.ties_authors = p.ties_authors;
    r.blur = p.blur;
    r.buffer = blur_buffer<acc_t, Team>(p.scratch, row, p.d);
    r.indices = p.indices + row * p.k_max;
    r.mask = p.mask + base;
    r.lam = p.lam + row;
    r.attention = p.attention + base;
    const bool* valid = p.valid == nullptr ? nullptr : p.valid + base;
    const void* logits = p.logits;
    const FloatType logits_type = p.logits_type;
    top_tau_team_row<VPT, BLUR>(
        team, r, [logits, logits_type, base](int j) { return load_logit<acc_t>(logits, logits_type, base + j); },
        [valid](int j) { return valid == nullptr || valid[j]; });
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
