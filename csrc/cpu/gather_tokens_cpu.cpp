// Torch binding of the gather_tokens CPU kernels: checks, dtype dispatch, at::parallel_for.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "cpu/gather_tokens_kernels.h"
#include "op_checks.h"
#include "ops.h"

namespace sopfast {
namespace {

GatherTokensShape gather_tokens_shape(const at::Tensor& indices, int64_t tokens, int64_t embed, int64_t prefix) {
  GatherTokensShape sh;
  sh.batch = indices.size(0);
  sh.groups = indices.size(1);
  sh.keep = indices.size(2);
  sh.tokens = tokens;
  sh.embed = embed;
  sh.prefix = prefix;
  return sh;
}

// Column blocks per batch element in the backward, so that small batches still fill the threads.
int64_t gather_tokens_column_blocks(int64_t batch, int64_t embed) {
  const int64_t wanted = (2 * at::get_num_threads() + batch - 1) / std::max<int64_t>(batch, 1);
  return std::max<int64_t>(1, std::min(wanted, embed / 64));
}

}  // namespace

template <>
at::Tensor gather_tokens_forward<c10::kCPU>(const at::Tensor& x_in, const at::Tensor& indices_in, int64_t prefix) {
  constexpr const char* op = "gather_tokens_forward";
  check_gather_tokens_forward(x_in, indices_in, prefix, c10::kCPU, true);
  const int64_t tokens = x_in.size(1), embed = x_in.size(2);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const GatherTokensShape sh = gather_tokens_shape(indices, tokens, embed, prefix);
  at::Tensor out = at::empty({sh.batch * sh.groups, sh.slots(), embed}, x.options());
  const int64_t rows = sh.batch * sh.groups * sh.slots();
  if (rows == 0 || embed == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
    const scalar_t* x_ptr = x.const_data_ptr<scalar_t>();
    const int64_t* idx_ptr = indices.const_data_ptr<int64_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / embed), [&](int64_t begin, int64_t end) {
      cpu::gather_tokens_forward_rows<scalar_t>(sh, x_ptr, idx_ptr, out_ptr, begin, end);
    });
  });
  return out;
}

template <>
at::Tensor gather_tokens_backward<c10::kCPU>(const at::Tensor& grad_in, const at::Tensor& indices_in, int64_t prefix,
                                             int64_t num_tokens) {
  constexpr const char* op = "gather_tokens_backward";
  check_gather_tokens_backward(grad_in, indices_in, prefix, num_tokens, c10::kCPU, true);
  const at::Tensor indices = indices_in.contiguous();
  const GatherTokensShape sh = gather_tokens_shape(indices, num_tokens, grad_in.size(2), prefix);
  const at::Tensor grad = grad_in.contiguous();
  at::Tensor grad_x = at::empty({sh.batch, num_tokens, sh.embed}, grad.options());
  if (grad_x.numel() == 0) return grad_x;
  const int64_t blocks = gather_tokens_column_blocks(sh.batch, sh.embed);
  const int64_t block_width = (sh.embed + blocks - 1) / blocks;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* g_ptr = grad.const_data_ptr<scalar_t>();
    const int64_t* idx_ptr = indices.const_data_ptr<int64_t>();
    scalar_t* out_ptr = grad_x.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, sh.batch * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t e_begin = (task % blocks) * block_width;
        const int64_t e_end = std::min(sh.embed, e_begin + block_width);
        if (e_begin >= e_end) continue;
        cpu::gather_tokens_backward_block<scalar_t, acc_t>(sh, g_ptr, idx_ptr, out_ptr, task / blocks, e_begin, e_end);
      }
    });
  });
  return grad_x;
}

}  // namespace sopfast
