// CUDA top_tau: one team of threads per row (8 lanes for d <= 32, a warp for d <= 1024, a block of
// 256 or 512 threads up to kTopTauCudaMaxFeatures), several rows per block, the row in registers:
// one pass over memory, no sorting -- the per-row algorithm of csrc/team_rows.h (blur -> softmax ->
// early-exit threshold search on team counts -> ties and indices by ballot prefix counts).  The blur
// stages the row in shared memory (global scratch for rows longer than kTopTauSharedFeatures).
// Backward: the closed form, then the blur's transpose in gather form.  Math in float32 (float64
// for double logits).
#include <type_traits>

#include "cuda/cuda_common.cuh"
#include "cuda/teams.cuh"
#include "team_rows.h"

namespace sopfast::cuda {
namespace {

extern __shared__ __align__(16) unsigned char team_shared_memory[];

template <typename scalar_t, typename acc_t>
struct ForwardParams {
  const scalar_t* logits;
  const bool* valid;
  const int64_t* k;
  int64_t rows, d, k_max;
  bool largest, ties_authors;
  BlurSpec<acc_t> blur;
  acc_t* scratch;  // [rows, d] or nullptr: the blur buffer in shared memory
  int64_t* indices;
  bool* mask;
  acc_t* lam;
  acc_t* attention;
};

template <typename Team, int VPT, typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(TeamBlock<Team>::threads) top_tau_forward_kernel(ForwardParams<scalar_t, acc_t> p) {
  constexpr int teams = TeamBlock<Team>::teams;
  const Team team;
  const int team_index = Team::index_in_block();
  acc_t* shared_buffer = reinterpret_cast<acc_t*>(team_shared_memory) + team_index * p.d;
  for (int64_t row = int64_t(blockIdx.x) * teams + team_index; row < p.rows; row += int64_t(gridDim.x) * teams) {
    TopTauRow<acc_t> r;
    r.d = p.d;
    r.k = p.k[row];
    r.k_max = p.k_max;
    r.largest = p.largest;
    r.ties_authors = p.ties_authors;
    r.blur = p.blur;
    r.buffer = p.scratch != nullptr ? p.scratch + row * p.d : shared_buffer;
    r.indices = p.indices + row * p.k_max;
    r.mask = p.mask + row * p.d;
    r.lam = p.lam + row;
    r.attention = p.attention + row * p.d;
    const scalar_t* logits = p.logits + row * p.d;
    const bool* valid = p.valid == nullptr ? nullptr : p.valid + row * p.d;
    top_tau_team_row<VPT>(
        team, r, [logits](int64_t j) { return load_as<acc_t>(logits + j); },
        [valid](int64_t j) { return valid == nullptr || valid[j]; });
  }
}

template <typename acc_t>
struct BackwardParams {
  const acc_t* attention;
  const bool* mask;
  const acc_t* lam;
  const acc_t* grad_lam;
  const acc_t* grad_attention;
  int64_t rows, d;
  BlurSpec<acc_t> blur;
  acc_t* scratch;
  acc_t* grad_logits;
};

template <typename Team, int VPT, typename acc_t>
__global__ void __launch_bounds__(TeamBlock<Team>::threads) top_tau_backward_kernel(BackwardParams<acc_t> p) {
  constexpr int teams = TeamBlock<Team>::teams;
  const Team team;
  const int team_index = Team::index_in_block();
  acc_t* shared_buffer = reinterpret_cast<acc_t*>(team_shared_memory) + team_index * p.d;
  for (int64_t row = int64_t(blockIdx.x) * teams + team_index; row < p.rows; row += int64_t(gridDim.x) * teams) {
    const int64_t base = row * p.d;
    const acc_t* a = p.attention + base;
    const bool* mask = p.mask + base;
    const acc_t* ga = p.grad_attention == nullptr ? nullptr : p.grad_attention + base;
    acc_t* out = p.grad_logits + base;
    top_tau_backward_team_row<VPT>(
        team, p.d, p.lam[row], p.grad_lam[row], ga != nullptr, p.blur,
        p.scratch != nullptr ? p.scratch + base : shared_buffer, [a](int64_t j) { return a[j]; },
        [mask](int64_t j) { return mask[j]; }, [ga](int64_t j) { return ga[j]; },
        [out](int64_t j, acc_t g) { out[j] = g; });
  }
}

// Launches kernel<Team, VPT> over `rows` rows, with the team blur buffers in shared memory when
// `shared_buffer` (d values of acc_t per team).
template <typename Team, typename Kernel, typename Params>
int launch_teams(Kernel kernel, const Params& p, int64_t acc_bytes, bool shared_buffer, cudaStream_t stream) {
  using Block = TeamBlock<Team>;
  const size_t shared = shared_buffer ? static_cast<size_t>(Block::teams * p.d * acc_bytes) : 0;
  kernel<<<grid_for(p.rows, Block::teams), Block::threads, shared, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

// Calls f(Team{}, VPT constant) for the team kind and values per thread that hold a row of d.
template <typename F>
int dispatch_team(int64_t d, F&& f) {
  using W8 = WarpTeam<8>;
  using W32 = WarpTeam<32>;
  using B256 = BlockTeam<256>;
  if (d <= 32) return f(W8{}, std::integral_constant<int, 4>{});
  if (d <= 64) return f(W32{}, std::integral_constant<int, 2>{});
  if (d <= 128) return f(W32{}, std::integral_constant<int, 4>{});
  if (d <= 256) return f(W32{}, std::integral_constant<int, 8>{});
  if (d <= 512) return f(W32{}, std::integral_constant<int, 16>{});
  if (d <= 1024) return f(W32{}, std::integral_constant<int, 32>{});
  if (d <= 2048) return f(B256{}, std::integral_constant<int, 8>{});
  if (d <= 8192) return f(B256{}, std::integral_constant<int, 32>{});
  if (d <= kTopTauCudaMaxFeatures) return f(BlockTeam<512>{}, std::integral_constant<int, 32>{});
  return static_cast<int>(cudaErrorInvalidValue);
}

template <typename acc_t>
BlurSpec<acc_t> blur_spec(const void* kernel, int64_t size, int64_t grid_h, int64_t grid_w) {
  BlurSpec<acc_t> blur;
  blur.kernel = static_cast<const acc_t*>(kernel);
  blur.size = kernel == nullptr ? 0 : size;
  blur.grid_h = grid_h;
  blur.grid_w = grid_w;
  return blur;
}

}  // namespace

int top_tau_forward_launch(const TopTauForwardArgs& args, void* stream) {
  if (args.rows == 0) return 0;
  const bool shared_buffer = args.blur_kernel != nullptr && args.d <= kTopTauSharedFeatures;
  if (args.blur_kernel != nullptr && !shared_buffer && args.scratch == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return dispatch_float_type(args.logits_type, [&](auto tag) {
    using scalar_t = decltype(tag);
    using acc_t = typename AccType<scalar_t>::type;
    ForwardParams<scalar_t, acc_t> p{static_cast<const scalar_t*>(args.logits),
                                     args.valid,
                                     args.k,
                                     args.rows,
                                     args.d,
                                     args.k_max,
                                     args.largest,
                                     args.ties_authors,
                                     blur_spec<acc_t>(args.blur_kernel, args.blur_size, args.grid_h, args.grid_w),
                                     shared_buffer ? nullptr : static_cast<acc_t*>(args.scratch),
                                     args.indices,
                                     args.mask,
                                     static_cast<acc_t*>(args.lam),
                                     static_cast<acc_t*>(args.attention)};
    return dispatch_team(args.d, [&](auto team, auto vpt) {
      using Team = decltype(team);
      return launch_teams<Team>(top_tau_forward_kernel<Team, decltype(vpt)::value, scalar_t, acc_t>, p,
                                sizeof(acc_t), shared_buffer, static_cast<cudaStream_t>(stream));
    });
  });
}

template <typename acc_t>
int launch_top_tau_backward(const TopTauBackwardArgs& args, bool shared_buffer, cudaStream_t stream) {
  BackwardParams<acc_t> p{static_cast<const acc_t*>(args.attention),
                          args.mask,
                          static_cast<const acc_t*>(args.lam),
                          static_cast<const acc_t*>(args.grad_lam),
                          static_cast<const acc_t*>(args.grad_attention),
                          args.rows,
                          args.d,
                          blur_spec<acc_t>(args.blur_kernel, args.blur_size, args.grid_h, args.grid_w),
                          shared_buffer ? nullptr : static_cast<acc_t*>(args.scratch),
                          static_cast<acc_t*>(args.grad_logits)};
  return dispatch_team(args.d, [&](auto team, auto vpt) {
    using Team = decltype(team);
    return launch_teams<Team>(top_tau_backward_kernel<Team, decltype(vpt)::value, acc_t>, p, sizeof(acc_t),
                              shared_buffer, stream);
  });
}

int top_tau_backward_launch(const TopTauBackwardArgs& args, void* stream) {
  if (args.rows == 0) return 0;
  const bool shared_buffer = args.blur_kernel != nullptr && args.d <= kTopTauSharedFeatures;
  if (args.blur_kernel != nullptr && !shared_buffer && args.scratch == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto s = static_cast<cudaStream_t>(stream);
  return args.is_double ? launch_top_tau_backward<double>(args, shared_buffer, s)
                        : launch_top_tau_backward<float>(args, shared_buffer, s);
}

}  // namespace sopfast::cuda
