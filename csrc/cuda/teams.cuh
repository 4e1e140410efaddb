// The thread teams that run the per-row algorithms of csrc/team_rows.h on the GPU: LANES lanes of a
// warp (4 to 32; several rows per warp for short rows) or a whole block of THREADS threads.
#pragma once

#include "cuda/cuda_common.cuh"

namespace sopfast::cuda {

// LANES consecutive lanes of a warp (LANES a power of two <= 32): shuffles and ballots restricted
// to the team's lanes, so that teams of one warp may run loops of different lengths.  One group.
template <int LANES>
struct WarpTeam {
  static_assert(LANES >= 2 && LANES <= kWarp && (LANES & (LANES - 1)) == 0, "LANES: a power of two in [2, 32]");
  static constexpr int kTeamsPerWarp = kWarp / LANES;

  unsigned mask;   // the team's lanes within the warp
  int first_lane;  // the team's first lane within the warp
  int team_rank;   // 0 .. LANES - 1

  __device__ WarpTeam() {
    const int lane = static_cast<int>(threadIdx.x % kWarp);
    team_rank = lane % LANES;
    first_lane = lane - team_rank;
    mask = LANES == kWarp ? kFullMask : (((1u << LANES) - 1u) << first_lane);
  }
  // The team's index within its block.
  __device__ static int index_in_block() { return static_cast<int>(threadIdx.x) / LANES; }

  __device__ int rank() const { return team_rank; }
  __device__ int size() const { return LANES; }
  __device__ int lanes() const { return LANES; }
  __device__ int group() const { return 0; }
  __device__ int lane() const { return team_rank; }
  template <typename T>
  __device__ T sum(T v) const {
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset);
    return v;
  }
  template <typename T>
  __device__ T max(T v) const {
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2) {
      const T other = __shfl_xor_sync(mask, v, offset);
      v = other > v ? other : v;
    }
    return v;
  }
  __device__ uint32_t ballot(bool flag) const { return (__ballot_sync(mask, flag) & mask) >> first_lane; }
  __device__ int groups_before(int count, int* total) const {
    *total = count;
    return 0;
  }
  __device__ void sync() const { __syncwarp(mask); }
};

// All THREADS threads of a block (a multiple of 32, at most 1024); a group is a warp.
template <int THREADS>
struct BlockTeam {
  __device__ static int index_in_block() { return 0; }
  __device__ int rank() const { return static_cast<int>(threadIdx.x); }
  __device__ int size() const { return THREADS; }
  __device__ int lanes() const { return kWarp; }
  __device__ int group() const { return static_cast<int>(threadIdx.x) / kWarp; }
  __device__ int lane() const { return static_cast<int>(threadIdx.x) % kWarp; }
  template <typename T>
  __device__ T sum(T v) const {
    return block_allreduce<THREADS>(v, SumOp{});
  }
  template <typename T>
  __device__ T max(T v) const {
    return block_allreduce<THREADS>(v, MaxOp{});
  }
  __device__ uint32_t ballot(bool flag) const { return __ballot_sync(kFullMask, flag); }
  __device__ int groups_before(int count, int* total) const { return block_warps_before<THREADS>(count, total); }
  __device__ void sync() const { __syncthreads(); }
};

// One thread (a row per thread, for rows of a few entries): every collective is the thread's own value.
struct ThreadTeam {
  static constexpr int kTeamsPerWarp = kWarp;
  __device__ static int index_in_block() { return static_cast<int>(threadIdx.x); }
  __device__ int rank() const { return 0; }
  __device__ int size() const { return 1; }
  __device__ int lanes() const { return 1; }
  __device__ int group() const { return 0; }
  __device__ int lane() const { return 0; }
  template <typename T>
  __device__ T sum(T v) const {
    return v;
  }
  template <typename T>
  __device__ T max(T v) const {
    return v;
  }
  __device__ uint32_t ballot(bool flag) const { return flag ? 1u : 0u; }
  __device__ int groups_before(int count, int* total) const {
    *total = count;
    return 0;
  }
  __device__ void sync() const {}
};

// Threads per block of a team kind: BlockTeam<N> -> N; WarpTeam and ThreadTeam -> kWarpTeamBlock.
constexpr int kWarpTeamBlock = 128;
template <typename Team>
struct TeamBlock {
  static constexpr int threads = kWarpTeamBlock;
  static constexpr int teams = kWarpTeamBlock / kWarp * Team::kTeamsPerWarp;
};
template <int THREADS>
struct TeamBlock<BlockTeam<THREADS>> {
  static constexpr int threads = THREADS;
  static constexpr int teams = 1;
};

}  // namespace sopfast::cuda
