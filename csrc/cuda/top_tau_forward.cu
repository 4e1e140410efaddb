// The float32 top_tau forward (csrc/cuda/top_tau_forward.cuh) and the launcher of both precisions.
#include "cuda/top_tau_forward.cuh"

namespace sopfast::cuda {

int top_tau_forward_launch(const TopTauForwardArgs& args, void* stream) {
  if (args.rows == 0) return 0;
  if (!has_blur_buffer(args.blur_kernel, args.d, args.scratch)) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  return args.logits_type == FloatType::kFloat64 ? top_tau_forward_double(args, s)
                                                 : launch_top_tau_forward<float>(args, s);
}

}  // namespace sopfast::cuda
