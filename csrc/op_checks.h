// Argument checks shared by every entry point of the ops: the torch bindings of the CPU and CUDA
// kernels call them first, and csrc/bindings.cpp exposes them to Python (sopfast._C.check_<kernel>)
// for the kernels registered in Python (the references, Triton, the fake/Meta kernels).  Each error
// names the op, the argument, what it got and what is allowed: a ValueError in Python (a TypeError
// for a wrong dtype).  `device` is the device type the binding serves; every other tensor must sit
// on the first input's device.  With `values`, the checks also read tensor values (per-row counts,
// indices) as check_int64_range does.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/_assert_async.h>
#include <ATen/ops/aminmax.h>

#include <algorithm>
#include <optional>
#include <string>

#include "sopfast_common.h"

namespace sopfast {

inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// The math type of an input dtype: float64 stays float64, everything else computes in float32.
inline at::ScalarType compute_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline void check_device_type(const char* op, const char* name, const at::Tensor& t, c10::DeviceType device) {
  TORCH_CHECK_VALUE(t.device().type() == device, op, ": ", name, " must be a ", c10::DeviceTypeName(device),
                    " tensor, got one on ", t.device());
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t, const at::Tensor& first,
                              const char* first_name) {
  TORCH_CHECK_VALUE(t.device() == first.device(), op, ": ", name, " is on ", t.device(), " but ", first_name,
                    " is on ", first.device(), " (every tensor must be on one device)");
}

inline void check_rank(const char* op, const char* name, const at::Tensor& t, int64_t rank, const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == rank, op, ": ", name, " must have ", rank, " dimensions ", layout, ", got shape ",
                    t.sizes());
}

inline void check_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
}

inline void check_same_shape(const char* op, const char* name, const at::Tensor& t, const at::Tensor& like,
                             const char* like_name) {
  TORCH_CHECK_VALUE(t.sizes() == like.sizes(), op, ": ", name, " must have the shape of ", like_name, " ",
                    like.sizes(), ", got ", t.sizes());
}

// A float32/float16/bfloat16/float64 tensor of the given rank on a `device` device.
inline void check_float_input(const char* op, const char* name, const at::Tensor& t, int64_t rank, const char* layout,
                              c10::DeviceType device) {
  check_device_type(op, name, t, device);
  TORCH_CHECK_TYPE(is_supported_float(t.scalar_type()), op, ": ", name,
                   " must be float32, float16, bfloat16 or float64, got ", t.scalar_type());
  check_rank(op, name, t, rank, layout);
}

// Every value of the int64 tensor t lies in [low, high] (`allowed` says so in words).  On the CPU the
// values are read (the error names the first value outside and its flat position); on any other
// device the check is one asynchronous device-side assertion, torch's _assert_async: no host sync, a
// value outside fails the next synchronising call (rerun on the CPU, or with CUDA_LAUNCH_BLOCKING=1,
// to see the message).  Meta tensors hold no values.
inline void check_int64_range(const char* op, const char* name, const at::Tensor& t, int64_t low, int64_t high,
                              const std::string& allowed) {
  if (t.numel() == 0 || t.is_meta()) return;
  if (t.is_cpu()) {
    const at::Tensor values = t.contiguous();
    const int64_t* ptr = values.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < values.numel(); ++i) {
      TORCH_CHECK_VALUE(low <= ptr[i] && ptr[i] <= high, op, ": ", name, " must lie in ", allowed, ", got ", ptr[i],
                        " (element ", i, ")");
    }
    return;
  }
  const auto [lowest, highest] = at::aminmax(t);
  at::_assert_async(lowest.ge(low).logical_and_(highest.le(high)),
                    std::string(op) + ": " + name + " must lie in " + allowed);
}

// ---- sparsemax ----

inline void check_sparsemax_forward(const at::Tensor& x, c10::DeviceType device) {
  check_float_input("sparsemax_forward", "x", x, 2, "[N, n]", device);
}

inline void check_sparsemax_backward(const at::Tensor& p, const at::Tensor& grad, c10::DeviceType device) {
  constexpr const char* op = "sparsemax_backward";
  check_float_input(op, "p", p, 2, "[N, n]", device);
  check_same_device(op, "grad", grad, p, "p");
  check_float_input(op, "grad", grad, 2, "[N, n]", device);
  check_same_shape(op, "grad", grad, p, "p");
  check_dtype(op, "p", p, grad.scalar_type());
}

// ---- top_tau ----

// The 1-D blur kernel: odd length, float32 or float64, its reflect padding (ks // 2) shorter
// than every blurred axis; and a grid (both sides > 0) must hold the d features.
inline void check_top_tau_blur(const char* op, const std::optional<at::Tensor>& blur_kernel, const at::Tensor& first,
                               int64_t d, int64_t grid_h, int64_t grid_w) {
  TORCH_CHECK_VALUE(grid_h >= 0 && grid_w >= 0, op, ": grid_h and grid_w must be >= 0, got ", grid_h, " and ",
                    grid_w);
  const bool grid = grid_h > 0 && grid_w > 0;
  TORCH_CHECK_VALUE(!grid || grid_h * grid_w == d, op, ": grid ", grid_h, "x", grid_w, " does not hold d=", d,
                    " features");
  if (!blur_kernel.has_value()) return;
  const at::Tensor& kernel = *blur_kernel;
  check_same_device(op, "blur_kernel", kernel, first, "logits");
  check_rank(op, "blur_kernel", kernel, 1, "[ks]");
  TORCH_CHECK_TYPE(kernel.scalar_type() == at::kFloat || kernel.scalar_type() == at::kDouble, op,
                   ": blur_kernel must be float32 or float64, got ", kernel.scalar_type());
  const int64_t ks = kernel.size(0);
  TORCH_CHECK_VALUE(ks % 2 == 1, op, ": blur_kernel must have an odd length, got ", ks);
  const int64_t shortest = grid ? std::min(grid_h, grid_w) : d;
  TORCH_CHECK_VALUE(ks / 2 < shortest, op, ": blur_kernel of length ", ks,
                    " is too long for reflect padding of an axis of ", shortest, " features (needs ks // 2 < ",
                    shortest, ")");
}

// k_max: the output width, in [1, d] (0 only without rows); k [N] int64, each row's count in
// [1, k_max] (read as check_int64_range does when `values`).
inline void check_top_tau_forward(const at::Tensor& logits, const std::optional<at::Tensor>& k, int64_t k_max,
                                  const std::optional<at::Tensor>& valid, const std::optional<at::Tensor>& blur_kernel,
                                  int64_t grid_h, int64_t grid_w, c10::DeviceType device, bool values) {
  constexpr const char* op = "top_tau_forward";
  check_float_input(op, "logits", logits, 2, "[N, d]", device);
  const int64_t n = logits.size(0), d = logits.size(1);
  TORCH_CHECK_VALUE(d <= kTopTauMaxFeatures, op, ": at most ", kTopTauMaxFeatures, " features per row, got d=", d);
  const int64_t fewest = n > 0 ? 1 : 0;
  TORCH_CHECK_VALUE(fewest <= k_max && k_max <= d, op, ": k_max (the features a row keeps at most) must lie in [",
                    fewest, ", d=", d, "], got ", k_max);
  if (k.has_value()) {
    check_same_device(op, "k", *k, logits, "logits");
    check_dtype(op, "k", *k, at::kLong);
    check_rank(op, "k", *k, 1, "[N]");
    TORCH_CHECK_VALUE(k->size(0) == n, op, ": k must hold one count per row (", n, "), got ", k->size(0));
    if (values) {
      check_int64_range(op, "k", *k, 1, k_max, "[1, k_max=" + std::to_string(k_max) + "] (the features a row keeps)");
    }
  }
  if (valid.has_value()) {
    check_same_device(op, "valid", *valid, logits, "logits");
    check_dtype(op, "valid", *valid, at::kBool);
    check_same_shape(op, "valid", *valid, logits, "logits");
  }
  check_top_tau_blur(op, blur_kernel, logits, d, grid_h, grid_w);
}

// lam, grad_lam [N] in the attention dtype.
inline void check_top_tau_row_vector(const char* name, const at::Tensor& t, const at::Tensor& attention) {
  constexpr const char* op = "top_tau_backward";
  check_same_device(op, name, t, attention, "attention");
  check_dtype(op, name, t, attention.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == attention.size(0), op, ": ", name, " must have shape [N=",
                    attention.size(0), "], got ", t.sizes());
}

inline void check_top_tau_backward(const at::Tensor& attention, const at::Tensor& mask, const at::Tensor& lam,
                                   const at::Tensor& grad_lam, const std::optional<at::Tensor>& grad_attention,
                                   const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w,
                                   c10::DeviceType device) {
  constexpr const char* op = "top_tau_backward";
  check_device_type(op, "attention", attention, device);
  check_rank(op, "attention", attention, 2, "[N, d]");
  const at::ScalarType dtype = attention.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kDouble, op, ": attention must be float32 or float64, got ",
                   dtype);
  check_same_device(op, "mask", mask, attention, "attention");
  check_dtype(op, "mask", mask, at::kBool);
  check_same_shape(op, "mask", mask, attention, "attention");
  check_top_tau_row_vector("lam", lam, attention);
  check_top_tau_row_vector("grad_lam", grad_lam, attention);
  if (grad_attention.has_value()) {
    check_same_device(op, "grad_attention", *grad_attention, attention, "attention");
    check_dtype(op, "grad_attention", *grad_attention, dtype);
    check_same_shape(op, "grad_attention", *grad_attention, attention, "attention");
  }
  check_top_tau_blur(op, blur_kernel, attention, attention.size(1), grid_h, grid_w);
}

// ---- gather_tokens ----

// indices int64 [B, m, k] on first's device.
inline void check_gather_tokens_indices(const char* op, const at::Tensor& indices, const at::Tensor& first,
                                        const char* first_name) {
  check_same_device(op, "indices", indices, first, first_name);
  check_dtype(op, "indices", indices, at::kLong);
  check_rank(op, "indices", indices, 3, "[B, m, k]");
}

// Each index in [-1, num_tokens) (-1: padding), read as check_int64_range does.
inline void check_gather_tokens_values(const char* op, const at::Tensor& indices, int64_t num_tokens) {
  check_int64_range(op, "indices", indices, -1, num_tokens - 1,
                    "[0, T=" + std::to_string(num_tokens) + ") or be -1 (padding)");
}

inline void check_gather_tokens_forward(const at::Tensor& x, const at::Tensor& indices, int64_t prefix,
                                        c10::DeviceType device, bool values) {
  constexpr const char* op = "gather_tokens_forward";
  check_float_input(op, "x", x, 3, "[B, T, E]", device);
  check_gather_tokens_indices(op, indices, x, "x");
  TORCH_CHECK_VALUE(indices.size(0) == x.size(0), op, ": indices batch ", indices.size(0), " does not match B=",
                    x.size(0), " (x has shape ", x.sizes(), ")");
  TORCH_CHECK_VALUE(0 <= prefix && prefix <= x.size(1), op, ": prefix must lie in [0, T=", x.size(1), "], got ",
                    prefix);
  if (values) check_gather_tokens_values(op, indices, x.size(1));
}

inline void check_gather_tokens_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t prefix,
                                         int64_t num_tokens, c10::DeviceType device, bool values) {
  constexpr const char* op = "gather_tokens_backward";
  check_float_input(op, "grad", grad, 3, "[B*m, prefix + k, E]", device);
  check_gather_tokens_indices(op, indices, grad, "grad");
  TORCH_CHECK_VALUE(0 <= prefix && prefix <= num_tokens, op, ": prefix must lie in [0, num_tokens=", num_tokens,
                    "], got ", prefix);
  const int64_t rows = indices.size(0) * indices.size(1), slots = prefix + indices.size(2);
  TORCH_CHECK_VALUE(grad.size(0) == rows && grad.size(1) == slots, op, ": grad must have shape [", rows, ", ", slots,
                    ", E] for indices of shape ", indices.sizes(), " and prefix ", prefix, ", got ", grad.sizes());
  if (values) check_gather_tokens_values(op, indices, num_tokens);
}

}  // namespace sopfast
