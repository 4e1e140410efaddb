// The team shapes and launch helpers of the CUDA top_tau kernels (top_tau_forward.cu,
// top_tau_backward.cu: one team of threads per row -- 8 lanes for d <= 32, a warp for d <= 1024, a
// block of 512 threads up to kTopTauCudaMaxFeatures -- several rows per block, the row in
// registers).  Five team shapes per kernel: the values per thread are a runtime count under a
// compile-time bound (a multiple of kRun), so one instantiation serves every row length up to its
// bound; a warp holds rows of up to 256 / 512 / 1,024 features in 8 / 16 / 32 values per thread.  The blur, a
// compile-time flag, stages the row in shared memory (global scratch for rows longer than
// kTopTauSharedFeatures) and passes through the output row.
#pragma once

#include "cuda/cuda_common.cuh"
#include "cuda/teams.cuh"
#include "team_rows.h"

namespace sopfast::cuda {
namespace {

extern __shared__ __align__(16) unsigned char team_shared_memory[];

// A team kind and its compile-time bound on the values per thread.
template <typename TeamT, int VPT_>
struct TeamShape {
  using Team = TeamT;
  static constexpr int vpt = VPT_;
};

// Calls f(TeamShape) for the team that holds a row of d.
template <typename F>
int dispatch_team(int64_t d, F&& f) {
  if (d <= 32) return f(TeamShape<WarpTeam<8>, 4>{});
  if (d <= 256) return f(TeamShape<WarpTeam<kWarp>, 8>{});
  if (d <= 512) return f(TeamShape<WarpTeam<kWarp>, 16>{});
  if (d <= 1024) return f(TeamShape<WarpTeam<kWarp>, 32>{});
  if (d <= kTopTauCudaMaxFeatures) return f(TeamShape<BlockTeam<512>, 32>{});
  return static_cast<int>(cudaErrorInvalidValue);
}

// Launches kernel over p.rows rows in blocks of the team kind, with the team blur buffers in
// shared memory when `shared_buffer` (d values of acc_t per team).
template <typename Team, typename acc_t, typename Kernel, typename Params>
int launch_teams(Kernel kernel, const Params& p, bool shared_buffer, cudaStream_t stream) {
  using Block = TeamBlock<Team>;
  const size_t shared = shared_buffer ? static_cast<size_t>(Block::teams) * p.d * sizeof(acc_t) : 0;
  kernel<<<grid_for(p.rows, Block::teams), Block::threads, shared, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

template <typename acc_t>
BlurSpec<acc_t> blur_spec(const void* kernel, int64_t size, int64_t grid_h, int64_t grid_w) {
  BlurSpec<acc_t> blur;
  blur.kernel = static_cast<const acc_t*>(kernel);
  blur.size = static_cast<int>(size);
  blur.grid_h = static_cast<int>(grid_h);
  blur.grid_w = static_cast<int>(grid_w);
  return blur;
}

// Whether the blur buffers fit in shared memory; else a blur needs `scratch`.
inline bool blur_in_shared_memory(int64_t d) { return d <= kTopTauSharedFeatures; }

// Whether a launch can go ahead: a blur of rows too long for shared memory needs `scratch`.
inline bool has_blur_buffer(const void* blur_kernel, int64_t d, const void* scratch) {
  return blur_kernel == nullptr || blur_in_shared_memory(d) || scratch != nullptr;
}

// The team's blur buffer: in shared memory, or the row's `scratch` (rows of d) when not null.
template <typename acc_t, typename Team>
__device__ acc_t* blur_buffer(acc_t* scratch, int64_t row, int d) {
  if (scratch != nullptr) return scratch + row * d;
  return reinterpret_cast<acc_t*>(team_shared_memory) + Team::index_in_block() * d;
}

}  // namespace
}  // namespace sopfast::cuda
