// The kernels of every op in PyTorch's dispatcher, one per dispatch key: the C++ CPU kernels for
// CPU and, in CUDA builds (SOPFAST_WITH_CUDA), the CUDA kernels for CUDA.  The schemas are declared
// once, in Python (each op's _backends.Op in python/sopfast/ops/<op>.py; the class and the library in
// python/sopfast/ops/_backends.py), the autograd once for every device (csrc/autograd.cpp); sopfast
// registers its Triton kernels for CUDA on top of these when Triton can run.  Any front-end calls the
// ops as torch.ops.sopfast.<op>.
#include <torch/library.h>

#include "ops.h"

namespace sopfast {
namespace {

template <c10::DeviceType kDevice>
void register_device_kernels(torch::Library& m) {
  m.impl("sparsemax", TORCH_FN(sparsemax_forward<kDevice>));
  m.impl("sparsemax_backward", TORCH_FN(sparsemax_backward<kDevice>));
  m.impl("top_tau", TORCH_FN(top_tau_forward<kDevice>));
  m.impl("top_tau_backward", TORCH_FN(top_tau_backward<kDevice>));
  m.impl("gather_tokens", TORCH_FN(gather_tokens_forward<kDevice>));
  m.impl("gather_tokens_backward", TORCH_FN(gather_tokens_backward<kDevice>));
}

}  // namespace

TORCH_LIBRARY_IMPL(sopfast, CPU, m) { register_device_kernels<c10::kCPU>(m); }

#ifdef SOPFAST_WITH_CUDA
TORCH_LIBRARY_IMPL(sopfast, CUDA, m) { register_device_kernels<c10::kCUDA>(m); }
#endif

}  // namespace sopfast
