// Text of the cudaError_t codes the launchers return.
#include <cuda_runtime.h>

#include "cuda/sopfast_cuda.h"

namespace sopfast::cuda {

const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace sopfast::cuda
