// CUDA top_tau backward, one team of threads per row (csrc/cuda/top_tau_teams.cuh): the closed
// form of csrc/team_rows.h, then the blur's transpose in gather form.  Math in float32 (float64 for
// double).
#include "cuda/top_tau_teams.cuh"

namespace sopfast::cuda {
namespace {

template <typename acc_t>
struct BackwardParams {
  const acc_t* attention;
  const bool* mask;
  const acc_t* lam;
  const acc_t* grad_lam;
  const acc_t* grad_attention;
  int64_t rows;
  int d;
  BlurSpec<acc_t> blur;
  acc_t* scratch;
  acc_t* grad_logits;
};

template <typename Team, int VPT, bool BLUR, typename acc_t>
__global__ void __launch_bounds__(TeamBlock<Team>::threads) top_tau_backward_kernel(BackwardParams<acc_t> p) {
  constexpr int teams = TeamBlock<Team>::teams;
  const Team team;
  for (int64_t row = int64_t(blockIdx.x) * teams + Team::index_in_block(); row < p.rows;
       row += int64_t(gridDim.x) * teams) {
    const int64_t base = row * p.d;
    const acc_t* a = p.attention + base;
    const bool* mask = p.mask + base;
    const acc_t* ga = p.grad_attention == nullptr ? nullptr : p.grad_attention + base;
    acc_t* out = p.grad_logits + base;
    top_tau_backward_team_row<VPT, BLUR>(
        team, p.d, p.lam[row], p.grad_lam[row], ga != nullptr, p.blur,
        blur_buffer<acc_t, Team>(p.scratch, row, p.d), out, [a](int j) { return a[j]; },
        [mask](int j) { return mask[j]; }, [ga](int j) { return ga[j]; }, [out](int j, acc_t g) { out[j] = g; });
  }
}

template <typename acc_t>
int launch_top_tau_backward(const TopTauBackwardArgs& args, cudaStream_t stream) {
  const bool blur = args.blur_kernel != nullptr;
  const bool shared_buffer = blur && blur_in_shared_memory(args.d);
  BackwardParams<acc_t> p{static_cast<const acc_t*>(args.attention),
                          args.mask,
                          static_cast<const acc_t*>(args.lam),
                          static_cast<const acc_t*>(args.grad_lam),
                          static_cast<const acc_t*>(args.grad_attention),
                          args.rows,
                          static_cast<int>(args.d),
                          blur_spec<acc_t>(args.blur_kernel, args.blur_size, args.grid_h, args.grid_w),
                          shared_buffer ? nullptr : static_cast<acc_t*>(args.scratch),
                          static_cast<acc_t*>(args.grad_logits)};
  return dispatch_team(args.d, [&](auto shape) {
    using Team = typename decltype(shape)::Team;
    constexpr int vpt = decltype(shape)::vpt;
    if (!blur) return launch_teams<Team, acc_t>(top_tau_backward_kernel<Team, vpt, false, acc_t>, p, false, stream);
    return launch_teams<Team, acc_t>(top_tau_backward_kernel<Team, vpt, true, acc_t>, p, shared_buffer, stream);
  });
}

}  // namespace

int top_tau_backward_launch(const TopTauBackwardArgs& args, void* stream) {
  if (args.rows == 0) return 0;
  if (!has_blur_buffer(args.blur_kernel, args.d, args.scratch)) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  return args.is_double ? launch_top_tau_backward<double>(args, s) : launch_top_tau_backward<float>(args, s);
}

}  // namespace sopfast::cuda
