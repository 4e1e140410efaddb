// The float64 top_tau forward (csrc/cuda/top_tau_forward.cuh).
#include "cuda/top_tau_forward.cuh"

namespace sopfast::cuda {

int top_tau_forward_double(const TopTauForwardArgs& args, cudaStream_t stream) {
  return launch_top_tau_forward<double>(args, stream);
}

}  // namespace sopfast::cuda
