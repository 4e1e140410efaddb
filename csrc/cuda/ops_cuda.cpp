// Torch binding of the CUDA kernels (compiled only in CUDA builds): the kCUDA entry points of
// csrc/ops.h -- checks, output allocation, the current stream, the raw-pointer launchers of
// csrc/cuda/*.cu (which apply the rule for rows without a result themselves).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/sopfast_cuda.h"
#include "op_checks.h"
#include "ops.h"

namespace sopfast {
namespace {

cuda::FloatType float_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return cuda::FloatType::kFloat32;
    case at::kHalf:
      return cuda::FloatType::kFloat16;
    case at::kBFloat16:
      return cuda::FloatType::kBFloat16;
    case at::kDouble:
      return cuda::FloatType::kFloat64;
    default:
      TORCH_CHECK(false, "sopfast CUDA kernels do not support ", t);
  }
}

void* current_stream() { return static_cast<void*>(at::cuda::getCurrentCUDAStream().stream()); }

void check_launch(const char* op, int code) {
  TORCH_CHECK(code == 0, op, ": CUDA kernel launch failed: ", cuda::error_string(code));
}

const void* optional_ptr(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->contiguous() : at::Tensor();
}

}  // namespace

template <>
at::Tensor sparsemax_forward<c10::kCUDA>(const at::Tensor& x_in) {
  check_sparsemax_forward(x_in, c10::kCUDA);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor p = at::empty(x.sizes(), x.options());
  check_launch("sparsemax_forward",
               cuda::sparsemax_forward_launch(x.const_data_ptr(), p.mutable_data_ptr(), x.size(0), x.size(1),
                                              float_type(x.scalar_type()), current_stream()));
  return p;
}

template <>
at::Tensor sparsemax_backward<c10::kCUDA>(const at::Tensor& p_in, const at::Tensor& grad_in) {
  check_sparsemax_backward(p_in, grad_in, c10::kCUDA);
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const at::Tensor p = p_in.contiguous(), grad = grad_in.contiguous();
  at::Tensor grad_x = at::empty(grad.sizes(), grad.options());
  check_launch("sparsemax_backward", cuda::sparsemax_backward_launch(
                                         p.const_data_ptr(), grad.const_data_ptr(), grad_x.mutable_data_ptr(),
                                         grad.size(0), grad.size(1), float_type(grad.scalar_type()), current_stream()));
  return grad_x;
}

template <>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> top_tau_forward<c10::kCUDA>(
    const at::Tensor& logits_in, const std::optional<at::Tensor>& k_in, int64_t k_max,
    const std::optional<at::Tensor>& valid_in, bool largest, bool ties_authors,
    const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w, bool need_attention,
    bool int32_indices) {
  check_top_tau_forward(logits_in, k_in, k_max, valid_in, blur_kernel, grid_h, grid_w, c10::kCUDA, true);
  TORCH_CHECK(logits_in.size(1) <= cuda::kTopTauCudaMaxFeatures, "top_tau_forward: the CUDA kernel takes at most ",
              cuda::kTopTauCudaMaxFeatures, " features per row, got d=", logits_in.size(1),
              " (the triton backend has no limit)");
  const c10::cuda::CUDAGuard guard(logits_in.device());
  const at::Tensor logits = logits_in.contiguous();
  const at::Tensor valid = contiguous_or_undefined(valid_in);
  const int64_t n = logits.size(0), d = logits.size(1);
  const at::Tensor k = k_in.has_value() ? k_in->contiguous() : at::Tensor();
  const at::ScalarType acc_dtype = compute_dtype(logits.scalar_type());
  const auto opts = logits.options();
  const at::Tensor kernel = blur_kernel.has_value() ? blur_kernel->to(acc_dtype).contiguous() : at::Tensor();
  const bool needs_scratch = kernel.defined() && d > cuda::kTopTauSharedFeatures;
  const at::Tensor scratch = needs_scratch ? at::empty({n, d}, opts.dtype(acc_dtype)) : at::Tensor();
  at::Tensor indices = at::empty({n, k_max}, opts.dtype(int32_indices ? at::kInt : at::kLong));
  at::Tensor mask = at::empty({n, d}, opts.dtype(at::kBool));
  at::Tensor lam = at::empty({n}, opts.dtype(acc_dtype));
  // a blur passes through the attention rows: they are kept as scratch when not asked for
  const bool attention_rows = need_attention || kernel.defined();
  at::Tensor attention = at::empty({n, attention_rows ? d : 0}, opts.dtype(acc_dtype));
  cuda::TopTauForwardArgs args;
  args.logits = logits.const_data_ptr();
  args.logits_type = float_type(logits.scalar_type());
  args.valid = valid.defined() ? valid.const_data_ptr<bool>() : nullptr;
  args.k = k.defined() ? k.const_data_ptr<int64_t>() : nullptr;
  args.rows = n;
  args.d = d;
  args.k_max = k_max;
  args.largest = largest;
  args.ties_authors = ties_authors;
  args.blur_kernel = optional_ptr(kernel);
  args.blur_size = kernel.defined() ? kernel.size(0) : 0;
  args.grid_h = grid_h;
  args.grid_w = grid_w;
  args.scratch = scratch.defined() ? scratch.mutable_data_ptr() : nullptr;
  args.indices = indices.mutable_data_ptr();
  args.int32_indices = int32_indices;
  args.mask = mask.mutable_data_ptr<bool>();
  args.lam = lam.mutable_data_ptr();
  args.attention = attention_rows ? attention.mutable_data_ptr() : nullptr;
  check_launch("top_tau_forward", cuda::top_tau_forward_launch(args, current_stream()));
  return {indices, mask, lam, need_attention ? attention : attention.narrow(1, 0, 0)};
}

template <>
at::Tensor top_tau_backward<c10::kCUDA>(const at::Tensor& attention_in, const at::Tensor& mask_in,
                                        const at::Tensor& lam_in, const at::Tensor& grad_lam_in,
                                        const std::optional<at::Tensor>& grad_attention_in,
                                        const std::optional<at::Tensor>& blur_kernel, int64_t grid_h, int64_t grid_w) {
  check_top_tau_backward(attention_in, mask_in, lam_in, grad_lam_in, grad_attention_in, blur_kernel, grid_h, grid_w,
                         c10::kCUDA);
  const c10::cuda::CUDAGuard guard(attention_in.device());
  const at::Tensor attention = attention_in.contiguous(), mask = mask_in.contiguous();
  const at::Tensor lam = lam_in.contiguous(), grad_lam = grad_lam_in.contiguous();
  const at::Tensor grad_attention = contiguous_or_undefined(grad_attention_in);
  const int64_t n = attention.size(0), d = attention.size(1);
  TORCH_CHECK(d <= cuda::kTopTauCudaMaxFeatures, "top_tau_backward: the CUDA kernel takes at most ",
              cuda::kTopTauCudaMaxFeatures, " features per row, got d=", d, " (the triton backend has no limit)");
  const at::Tensor kernel =
      blur_kernel.has_value() ? blur_kernel->to(attention.scalar_type()).contiguous() : at::Tensor();
  const bool needs_scratch = kernel.defined() && d > cuda::kTopTauSharedFeatures;
  const at::Tensor scratch = needs_scratch ? at::empty({n, d}, attention.options()) : at::Tensor();
  at::Tensor grad_logits = at::empty({n, d}, attention.options());
  cuda::TopTauBackwardArgs args;
  args.is_double = attention.scalar_type() == at::kDouble;
  args.attention = attention.const_data_ptr();
  args.mask = mask.const_data_ptr<bool>();
  args.lam = lam.const_data_ptr();
  args.grad_lam = grad_lam.const_data_ptr();
  args.grad_attention = optional_ptr(grad_attention);
  args.rows = n;
  args.d = d;
  args.blur_kernel = optional_ptr(kernel);
  args.blur_size = kernel.defined() ? kernel.size(0) : 0;
  args.grid_h = grid_h;
  args.grid_w = grid_w;
  args.scratch = scratch.defined() ? scratch.mutable_data_ptr() : nullptr;
  args.grad_logits = grad_logits.mutable_data_ptr();
  check_launch("top_tau_backward", cuda::top_tau_backward_launch(args, current_stream()));
  return grad_logits;
}

namespace {

GatherTokensShape gather_tokens_dims(const at::Tensor& indices, int64_t tokens, int64_t embed, int64_t prefix) {
  GatherTokensShape dims;
  dims.batch = indices.size(0);
  dims.groups = indices.size(1);
  dims.keep = indices.size(2);
  dims.tokens = tokens;
  dims.embed = embed;
  dims.prefix = prefix;
  return dims;
}

}  // namespace

template <>
at::Tensor gather_tokens_forward<c10::kCUDA>(const at::Tensor& x_in, const at::Tensor& indices_in, int64_t prefix) {
  check_gather_tokens_forward(x_in, indices_in, prefix, c10::kCUDA, true);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), indices = indices_in.contiguous();
  const GatherTokensShape dims = gather_tokens_dims(indices, x.size(1), x.size(2), prefix);
  at::Tensor out = at::empty({dims.batch * dims.groups, dims.prefix + dims.keep, dims.embed}, x.options());
  check_launch(
      "gather_tokens_forward",
      cuda::gather_tokens_forward_launch(x.const_data_ptr(), indices.const_data_ptr<int64_t>(), out.mutable_data_ptr(),
                                         dims, float_type(x.scalar_type()), current_stream()));
  return out;
}

template <>
at::Tensor gather_tokens_backward<c10::kCUDA>(const at::Tensor& grad_in, const at::Tensor& indices_in, int64_t prefix,
                                              int64_t num_tokens) {
  check_gather_tokens_backward(grad_in, indices_in, prefix, num_tokens, c10::kCUDA, true);
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const at::Tensor grad = grad_in.contiguous(), indices = indices_in.contiguous();
  const GatherTokensShape dims = gather_tokens_dims(indices, num_tokens, grad.size(2), prefix);
  at::Tensor grad_x = at::empty({dims.batch, num_tokens, dims.embed}, grad.options());
  at::Tensor workspace = at::empty({cuda::gather_tokens_backward_workspace(dims)}, indices.options());
  check_launch("gather_tokens_backward",
               cuda::gather_tokens_backward_launch(grad.const_data_ptr(), indices.const_data_ptr<int64_t>(),
                                                   grad_x.mutable_data_ptr(), dims, float_type(grad.scalar_type()),
                                                   workspace.mutable_data_ptr<int64_t>(), current_stream()));
  return grad_x;
}

}  // namespace sopfast
