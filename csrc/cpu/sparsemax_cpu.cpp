// Torch binding of the sparsemax CPU kernels: checks, dtype dispatch, at::parallel_for over rows.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "cpu/sparsemax_kernels.h"
#include "op_checks.h"
#include "ops.h"

namespace sopfast {
namespace {

// Rows per parallel task: about 16k elements.
int64_t sparsemax_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

}  // namespace

template <>
at::Tensor sparsemax_forward<c10::kCPU>(const at::Tensor& x_in) {
  constexpr const char* op = "sparsemax_forward";
  check_sparsemax_forward(x_in, c10::kCPU);
  const at::Tensor x = x_in.contiguous();
  at::Tensor p = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return p;
  const int64_t n = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* x_ptr = x.const_data_ptr<scalar_t>();
    scalar_t* p_ptr = p.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, x.size(0), sparsemax_grain(n), [&](int64_t begin, int64_t end) {
      cpu::sparsemax_forward_rows<scalar_t, acc_t>(x_ptr, p_ptr, n, begin, end);
    });
  });
  return p;
}

template <>
at::Tensor sparsemax_backward<c10::kCPU>(const at::Tensor& p_in, const at::Tensor& grad_in) {
  constexpr const char* op = "sparsemax_backward";
  check_sparsemax_backward(p_in, grad_in, c10::kCPU);
  const at::Tensor p = p_in.contiguous();
  const at::Tensor grad = grad_in.contiguous();
  at::Tensor grad_x = at::empty(grad.sizes(), grad.options());
  if (grad.numel() == 0) return grad_x;
  const int64_t n = grad.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* p_ptr = p.const_data_ptr<scalar_t>();
    const scalar_t* g_ptr = grad.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = grad_x.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, grad.size(0), sparsemax_grain(n), [&](int64_t begin, int64_t end) {
      cpu::sparsemax_backward_rows<scalar_t, acc_t>(p_ptr, g_ptr, out_ptr, n, begin, end);
    });
  });
  return grad_x;
}

}  // namespace sopfast
