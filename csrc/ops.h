// Torch entry points of every op, declared once for both devices: kDevice = c10::kCPU is defined
// in csrc/cpu/*_cpu.cpp, c10::kCUDA in csrc/cuda/ops_cuda.cpp (CUDA builds only).
// csrc/bindings.cpp exposes them to Python as sopfast._C.<op>_<direction>_<device> (device: cpu,
// cuda).  Shapes and semantics: python/sopfast/ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <optional>
#include <tuple>

namespace sopfast {

// x [N, n] -> p [N, n], same dtype; a row holding NaN, or only -inf, gives NaN.
template <c10::DeviceType kDevice>
at::Tensor sparsemax_forward(const at::Tensor& x);
// p, grad [N, n] -> grad_x [N, n] in grad's dtype.
template <c10::DeviceType kDevice>
at::Tensor sparsemax_backward(const at::Tensor& p, const at::Tensor& grad);

// logits [N, d], k int64 [N] in [1, k_max] (none: every row keeps k_max; k_max in [1, d], 0 only for
// N = 0) -> (indices [N, k_max] int64 (int32 with int32_indices), mask bool [N, d], lam [N], attention
// [N, d] ([N, 0] without need_attention)); valid features rank first, so a row's k above its valid
// count also keeps invalid ones (sopfast.ops.top_tau refuses such a k).  A row
// without a result (a NaN among its valid logits, or none above -inf; with a blur any NaN or infinity)
// keeps no feature: indices -1, mask false, NaN lam and attention.  ties_authors ranks the attention
// (equal values: higher index first when largest), else the blurred logits (equal values: lower index
// first).
template <c10::DeviceType kDevice>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> top_tau_forward(
    const at::Tensor& logits, const std::optional<at::Tensor>& k, int64_t k_max, const std::optional<at::Tensor>& valid,
    bool largest, bool ties_authors, const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w,
    bool need_attention, bool int32_indices);
// -> grad_logits [N, d] in attention's dtype.
template <c10::DeviceType kDevice>
at::Tensor top_tau_backward(const at::Tensor& attention, const at::Tensor& mask, const at::Tensor& lam,
                            const at::Tensor& grad_lam, const std::optional<at::Tensor>& grad_attention,
                            const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w);

// x [B, T, E], indices int64 [B, m, k] in [-1, T) (-1: padding, a zero row) -> [B*m, prefix + k, E].
template <c10::DeviceType kDevice>
at::Tensor gather_tokens_forward(const at::Tensor& x, const at::Tensor& indices, int64_t prefix);
// grad [B*m, prefix + k, E] -> grad_x [B, num_tokens, E] in grad's dtype.
template <c10::DeviceType kDevice>
at::Tensor gather_tokens_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t prefix,
                                  int64_t num_tokens);

}  // namespace sopfast
