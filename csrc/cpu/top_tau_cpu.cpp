// Torch binding of the top_tau CPU kernels: checks, dtype dispatch, at::parallel_for over rows.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "cpu/top_tau_kernels.h"
#include "op_checks.h"
#include "ops.h"

namespace sopfast {
namespace {

// Rows per parallel task: about 4k features.
int64_t top_tau_grain(int64_t d) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)); }

// The blur kernel in the math dtype (a [ks] tensor kept alive by the caller), or undefined.
at::Tensor top_tau_blur_kernel(const std::optional<at::Tensor>& blur_kernel, at::ScalarType acc_dtype) {
  return blur_kernel.has_value() ? blur_kernel->to(acc_dtype).contiguous() : at::Tensor();
}

template <typename acc_t>
cpu::TopTauProblem<acc_t> top_tau_problem(int64_t d, int64_t k_max, bool largest, bool ties_authors,
                                          const at::Tensor& kernel, int64_t grid_h, int64_t grid_w) {
  cpu::TopTauProblem<acc_t> pb;
  pb.d = d;
  pb.k_max = k_max;
  pb.largest = largest;
  pb.ties_authors = ties_authors;
  if (kernel.defined()) {
    pb.blur_kernel = kernel.const_data_ptr<acc_t>();
    pb.blur_size = kernel.size(0);
  }
  pb.grid_h = grid_h;
  pb.grid_w = grid_w;
  return pb;
}

}  // namespace

template <>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> top_tau_forward<c10::kCPU>(
    const at::Tensor& logits_in, const std::optional<at::Tensor>& k_in, int64_t k_max,
    const std::optional<at::Tensor>& valid_in, bool largest, bool ties_authors,
    const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w, bool need_attention,
    bool int32_indices) {
  constexpr const char* op = "top_tau_forward";
  check_top_tau_forward(logits_in, k_in, k_max, valid_in, blur_kernel, grid_h, grid_w, c10::kCPU, true);
  const int64_t n = logits_in.size(0), d = logits_in.size(1);
  const at::Tensor logits = logits_in.contiguous();
  const at::Tensor k = k_in.has_value() ? k_in->contiguous() : at::Tensor();
  const at::Tensor valid = valid_in.has_value() ? valid_in->contiguous() : at::Tensor();
  const at::ScalarType acc_dtype = compute_dtype(logits.scalar_type());
  const at::Tensor kernel = top_tau_blur_kernel(blur_kernel, acc_dtype);
  const auto opts = logits.options();
  at::Tensor indices = at::empty({n, k_max}, opts.dtype(int32_indices ? at::kInt : at::kLong));
  at::Tensor mask = at::empty({n, d}, opts.dtype(at::kBool));
  at::Tensor lam = at::empty({n}, opts.dtype(acc_dtype));
  at::Tensor attention = at::empty({n, need_attention ? d : 0}, opts.dtype(acc_dtype));
  if (n == 0) return {indices, mask, lam, attention};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto pb = top_tau_problem<acc_t>(d, k_max, largest, ties_authors, kernel, grid_h, grid_w);
    const scalar_t* logits_ptr = logits.const_data_ptr<scalar_t>();
    const bool* valid_ptr = valid.defined() ? valid.const_data_ptr<bool>() : nullptr;
    const int64_t* k_ptr = k.defined() ? k.const_data_ptr<int64_t>() : nullptr;
    bool* mask_ptr = mask.mutable_data_ptr<bool>();
    acc_t* lam_ptr = lam.mutable_data_ptr<acc_t>();
    acc_t* attention_ptr = need_attention ? attention.mutable_data_ptr<acc_t>() : nullptr;
    auto rows = [&](auto* indices_ptr) {
      at::parallel_for(0, n, top_tau_grain(d), [&](int64_t begin, int64_t end) {
        cpu::top_tau_forward_rows<scalar_t, acc_t>(pb, logits_ptr, valid_ptr, k_ptr, indices_ptr, mask_ptr, lam_ptr,
                                                   attention_ptr, begin, end);
      });
    };
    if (int32_indices) {
      rows(indices.mutable_data_ptr<int32_t>());
    } else {
      rows(indices.mutable_data_ptr<int64_t>());
    }
  });
  return {indices, mask, lam, attention};
}

template <>
at::Tensor top_tau_backward<c10::kCPU>(const at::Tensor& attention_in, const at::Tensor& mask_in,
                                       const at::Tensor& lam_in, const at::Tensor& grad_lam_in,
                                       const std::optional<at::Tensor>& grad_attention_in,
                                       const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w) {
  constexpr const char* op = "top_tau_backward";
  check_top_tau_backward(attention_in, mask_in, lam_in, grad_lam_in, grad_attention_in, blur_kernel, grid_h, grid_w,
                         c10::kCPU);
  const at::ScalarType dtype = attention_in.scalar_type();
  const int64_t n = attention_in.size(0), d = attention_in.size(1);
  const at::Tensor attention = attention_in.contiguous(), mask = mask_in.contiguous();
  const at::Tensor lam = lam_in.contiguous(), grad_lam = grad_lam_in.contiguous();
  const at::Tensor grad_attention = grad_attention_in.has_value() ? grad_attention_in->contiguous() : at::Tensor();
  const at::Tensor kernel = top_tau_blur_kernel(blur_kernel, dtype);
  at::Tensor grad_logits = at::empty({n, d}, attention.options());
  if (n == 0) return grad_logits;
  AT_DISPATCH_FLOATING_TYPES(dtype, op, [&] {
    const auto pb = top_tau_problem<scalar_t>(d, 0, true, false, kernel, grid_h, grid_w);
    const scalar_t* a_ptr = attention.const_data_ptr<scalar_t>();
    const bool* mask_ptr = mask.const_data_ptr<bool>();
    const scalar_t* lam_ptr = lam.const_data_ptr<scalar_t>();
    const scalar_t* grad_lam_ptr = grad_lam.const_data_ptr<scalar_t>();
    const scalar_t* ga_ptr = grad_attention.defined() ? grad_attention.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* out_ptr = grad_logits.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, top_tau_grain(d), [&](int64_t begin, int64_t end) {
      cpu::top_tau_backward_rows<scalar_t>(pb, a_ptr, mask_ptr, lam_ptr, grad_lam_ptr, ga_ptr, out_ptr, begin, end);
    });
  });
  return grad_logits;
}

}  // namespace sopfast
