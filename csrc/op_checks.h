// Argument checks shared by the torch bindings of the CPU and CUDA kernels.  Each error names
// the op, the argument, what it got and what is allowed.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace sopfast {

inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// The math type of an input dtype: float64 stays float64, everything else computes in float32.
inline at::ScalarType compute_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline void check_device(const char* op, const char* name, const at::Tensor& t, c10::DeviceType device) {
  TORCH_CHECK(t.device().type() == device, op, ": ", name, " must be a ", c10::DeviceTypeName(device, true),
              " tensor, got one on ", t.device());
}

inline void check_rank(const char* op, const char* name, const at::Tensor& t, int64_t rank, const char* layout) {
  TORCH_CHECK(t.dim() == rank, op, ": ", name, " must have ", rank, " dimensions ", layout, ", got shape ", t.sizes());
}

inline void check_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype) {
  TORCH_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
}

inline void check_float(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(is_supported_float(t.scalar_type()), op, ": ", name,
              " must be float32, float16, bfloat16 or float64, got ", t.scalar_type());
}

inline void check_same_shape(const char* op, const char* name, const at::Tensor& t, const at::Tensor& like,
                             const char* like_name) {
  TORCH_CHECK(t.sizes() == like.sizes(), op, ": ", name, " must have the shape of ", like_name, " ", like.sizes(),
              ", got ", t.sizes());
}

// A float tensor of the given rank on `device`.
inline void check_float_input(const char* op, const char* name, const at::Tensor& t, int64_t rank, const char* layout,
                              c10::DeviceType device) {
  check_device(op, name, t, device);
  check_float(op, name, t);
  check_rank(op, name, t, rank, layout);
}

// The 1-D blur kernel of top_tau: odd length, float32 or float64, and its reflect padding
// (size // 2) smaller than every blurred axis.
inline void check_blur_kernel(const char* op, const std::optional<at::Tensor>& blur_kernel, int64_t d, int64_t grid_h,
                              int64_t grid_w, c10::DeviceType device) {
  TORCH_CHECK(grid_h >= 0 && grid_w >= 0, op, ": grid_h and grid_w must be >= 0, got ", grid_h, " and ", grid_w);
  const bool grid = grid_h > 0 && grid_w > 0;
  TORCH_CHECK(!grid || grid_h * grid_w == d, op, ": grid ", grid_h, "x", grid_w, " does not hold d=", d, " features");
  if (!blur_kernel.has_value()) return;
  const at::Tensor& kernel = *blur_kernel;
  check_device(op, "blur_kernel", kernel, device);
  check_rank(op, "blur_kernel", kernel, 1, "[ks]");
  TORCH_CHECK(kernel.scalar_type() == at::kFloat || kernel.scalar_type() == at::kDouble, op,
              ": blur_kernel must be float32 or float64, got ", kernel.scalar_type());
  const int64_t ks = kernel.size(0);
  TORCH_CHECK(ks % 2 == 1, op, ": blur_kernel must have an odd length, got ", ks);
  const int64_t shortest = grid ? std::min(grid_h, grid_w) : d;
  TORCH_CHECK(ks / 2 < shortest, op, ": blur_kernel of length ", ks, " is too long for reflect padding of an axis of ",
              shortest, " features (needs ks // 2 < ", shortest, ")");
}

}  // namespace sopfast
