// Torch entry points of the CPU kernels (exposed to Python by csrc/bindings.cpp as
// sopfast._C.<name without the _cpu suffix>).  Shapes and semantics: python/sopfast/ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace sopfast {

// x [N, n] -> p [N, n], same dtype.
at::Tensor sparsemax_forward_cpu(const at::Tensor& x);
// p, grad [N, n] -> grad_x [N, n] in grad's dtype.
at::Tensor sparsemax_backward_cpu(const at::Tensor& p, const at::Tensor& grad);

// logits [N, d], k int64 [N] -> (indices int64 [N, k_max], mask bool [N, d], lam [N], attention [N, d]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> top_tau_forward_cpu(
    const at::Tensor& logits, const at::Tensor& k, int64_t k_max, const std::optional<at::Tensor>& valid, bool largest,
    const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w);
// -> grad_logits [N, d] in attention's dtype.
at::Tensor top_tau_backward_cpu(const at::Tensor& attention, const at::Tensor& mask, const at::Tensor& lam,
                                const at::Tensor& grad_lam, const std::optional<at::Tensor>& grad_attention,
                                const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w);

// x [B, T, E], indices int64 [B, m, k] -> [B*m, prefix + k, E].
at::Tensor gather_tokens_forward_cpu(const at::Tensor& x, const at::Tensor& indices, int64_t prefix);
// grad [B*m, prefix + k, E] -> grad_x [B, num_tokens, E] in grad's dtype.
at::Tensor gather_tokens_backward_cpu(const at::Tensor& grad, const at::Tensor& indices, int64_t prefix,
                                      int64_t num_tokens);

}  // namespace sopfast
