// The autograd of every op, registered once for every device (the Autograd dispatch key).  Each
// forward runs the kernel the dispatcher holds for the inputs' device below autograd; each backward
// calls the op's backward through the dispatcher, so that it too runs on the device's kernel and
// records its own graph under create_graph (second derivatives):
//   sparsemax        backward: sparsemax_backward, itself linear in the incoming gradient;
//   gather_tokens    backward: gather_tokens_backward (a scatter-add), whose backward is the gather;
//   top_tau          backward: top_tau_backward, or under create_graph the same closed form in
//                    differentiable ATen ops (python/sopfast/ops/top_tau.py, top_tau_backward_reference);
//                    a forward asked for no attention computes it all the same when lam needs a
//                    gradient (its backward reads it), and returns [N, 0].
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace sopfast {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<at::Tensor>;
using TopTauOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// ---- the ops, called through the dispatcher (the handles are looked up once, at first use) ----

at::Tensor call_sparsemax(const at::Tensor& x) {
  static const auto op = op_handle<at::Tensor(const at::Tensor&)>("sopfast::sparsemax");
  return op.call(x);
}

at::Tensor call_sparsemax_backward(const at::Tensor& p, const at::Tensor& grad) {
  static const auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("sopfast::sparsemax_backward");
  return op.call(p, grad);
}

TopTauOutputs call_top_tau(const at::Tensor& logits, const OptionalTensor& k, int64_t k_max, const OptionalTensor& valid,
                           bool largest, bool ties_authors, const OptionalTensor& blur_kernel, int64_t grid_h,
                           int64_t grid_w, bool need_attention, bool int32_indices) {
  static const auto op =
      op_handle<TopTauOutputs(const at::Tensor&, const OptionalTensor&, int64_t, const OptionalTensor&, bool, bool,
                              const OptionalTensor&, int64_t, int64_t, bool, bool)>("sopfast::top_tau");
  return op.call(logits, k, k_max, valid, largest, ties_authors, blur_kernel, grid_h, grid_w, need_attention,
                 int32_indices);
}

at::Tensor call_top_tau_backward(const at::Tensor& attention, const at::Tensor& mask, const at::Tensor& lam,
                                 const at::Tensor& grad_lam, const OptionalTensor& grad_attention,
                                 const OptionalTensor& blur_kernel, int64_t grid_h, int64_t grid_w) {
  static const auto op =
      op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const OptionalTensor&, const OptionalTensor&, int64_t, int64_t)>("sopfast::top_tau_backward");
  return op.call(attention, mask, lam, grad_lam, grad_attention, blur_kernel, grid_h, grid_w);
}

at::Tensor call_gather_tokens(const at::Tensor& x, const at::Tensor& indices, int64_t prefix) {
  static const auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>("sopfast::gather_tokens");
  return op.call(x, indices, prefix);
}

at::Tensor call_gather_tokens_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t prefix,
                                       int64_t num_tokens) {
  static const auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t)>(
      "sopfast::gather_tokens_backward");
  return op.call(grad, indices, prefix, num_tokens);
}

// ---- sparsemax ----

class SparsemaxBackwardFunction : public torch::autograd::Function<SparsemaxBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& p, const at::Tensor& grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({p});
    return call_sparsemax_backward(p, grad);
  }

  // linear in grad and its own adjoint; the support {p > 0} is locally constant: no gradient for p
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0];
    return {at::Tensor(), call_sparsemax_backward(p, grads[0].contiguous())};
  }
};

class SparsemaxFunction : public torch::autograd::Function<SparsemaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor p = call_sparsemax(x);
    ctx->save_for_backward({p});
    return p;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0];
    return {call_sparsemax_backward(p, grads[0].contiguous())};
  }
};

// ---- top_tau ----

// The transpose of the reflect-padded correlation of the last axis of g [..., n] with kernel [ks],
// in differentiable ATen ops (python/sopfast/ops/blur.py, _blur_axis_adjoint).
at::Tensor blur_axis_adjoint(const at::Tensor& g, const at::Tensor& kernel) {
  const int64_t n = g.size(-1), ks = kernel.size(0), pad = ks / 2;
  const at::Tensor spread = at::conv_transpose1d(g.reshape({-1, 1, n}), kernel.view({1, 1, ks})).squeeze(1);
  at::Tensor source = at::arange(-pad, n + pad, g.options().dtype(at::kLong)).abs();
  source = at::where(source >= n, 2 * (n - 1) - source, source);
  return at::zeros({spread.size(0), n}, g.options()).index_add(1, source, spread).reshape(g.sizes());
}

// top_tau_backward's closed form (csrc/ops.h) in differentiable ATen ops, for create_graph.
at::Tensor top_tau_backward_differentiable(const at::Tensor& a, const at::Tensor& mask, const at::Tensor& lam,
                                           const at::Tensor& grad_lam, const at::Tensor& grad_attention,
                                           const at::Tensor& blur_kernel, int64_t grid_h, int64_t grid_w) {
  const at::Tensor sign = mask.to(a.scalar_type()) * 2 - 1;
  at::Tensor g = a * (grad_lam.to(a.scalar_type()).unsqueeze(1) * (sign - lam.unsqueeze(1)));
  if (grad_attention.defined()) {
    const at::Tensor ga = grad_attention.to(a.scalar_type());
    g = g + a * (ga - (a * ga).sum(-1, true));
  }
  if (!blur_kernel.defined()) return g;
  const at::Tensor kernel = blur_kernel.to(a.scalar_type());
  if (grid_h <= 0 || grid_w <= 0) return blur_axis_adjoint(g, kernel);
  const int64_t n = g.size(0);
  const at::Tensor columns = blur_axis_adjoint(g.reshape({n, grid_h, grid_w}).transpose(1, 2), kernel).transpose(1, 2);
  return blur_axis_adjoint(columns, kernel).reshape({n, grid_h * grid_w});
}

class TopTauFunction : public torch::autograd::Function<TopTauFunction> {
 public:
  // keep_attention: compute the attention for the backward even when the caller asked for none
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const OptionalTensor& k, int64_t k_max,
                               const OptionalTensor& valid, bool largest, bool ties_authors,
                               const OptionalTensor& blur_kernel, int64_t grid_h, int64_t grid_w, bool need_attention,
                               bool int32_indices, bool keep_attention) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [indices, mask, lam, attention] = call_top_tau(logits, k, k_max, valid, largest, ties_authors, blur_kernel,
                                                        grid_h, grid_w, need_attention || keep_attention, int32_indices);
    ctx->save_for_backward({attention, mask, lam, blur_kernel.value_or(at::Tensor())});
    ctx->saved_data["grid_h"] = grid_h;
    ctx->saved_data["grid_w"] = grid_w;
    ctx->saved_data["dtype"] = logits.scalar_type();
    if (need_attention) {
      ctx->mark_non_differentiable({indices, mask});
      return {indices, mask, lam, attention};
    }
    at::Tensor none = attention.narrow(1, 0, 0).clone();
    ctx->mark_non_differentiable({indices, mask, none});
    return {indices, mask, lam, none};
  }

  // lam and attention are differentiable, indices and mask are not
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &attention = saved[0], &mask = saved[1], &lam = saved[2], &blur_kernel = saved[3];
    const int64_t grid_h = ctx->saved_data["grid_h"].toInt(), grid_w = ctx->saved_data["grid_w"].toInt();
    const at::Tensor grad_lam = grads[2].defined() ? grads[2].contiguous() : at::zeros_like(lam);
    const bool attention_out = grads[3].defined() && grads[3].size(1) == attention.size(1);
    const at::Tensor grad_attention = attention_out ? grads[3].contiguous() : at::Tensor();
    at::Tensor grad;
    if (at::GradMode::is_enabled()) {
      // create_graph: attention and lam are this function's outputs, so second derivatives flow back
      // through this backward again
      grad = top_tau_backward_differentiable(attention, mask, lam, grad_lam, grad_attention, blur_kernel, grid_h,
                                             grid_w);
    } else {
      const auto optional = [](const at::Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; };
      grad = call_top_tau_backward(attention, mask, lam, grad_lam, optional(grad_attention), optional(blur_kernel),
                                   grid_h, grid_w);
    }
    variable_list result(12);
    result[0] = grad.to(ctx->saved_data["dtype"].toScalarType());
    return result;
  }
};

// ---- gather_tokens ----

class GatherTokensBackwardFunction : public torch::autograd::Function<GatherTokensBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& indices, int64_t prefix,
                            int64_t num_tokens) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({indices});
    ctx->saved_data["prefix"] = prefix;
    return call_gather_tokens_backward(grad, indices, prefix, num_tokens);
  }

  // linear in grad: its adjoint is the gather
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    const at::Tensor grad = call_gather_tokens(grads[0].contiguous(), indices, ctx->saved_data["prefix"].toInt());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class GatherTokensFunction : public torch::autograd::Function<GatherTokensFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& indices, int64_t prefix) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({indices});
    ctx->saved_data["prefix"] = prefix;
    ctx->saved_data["num_tokens"] = x.size(1);
    return call_gather_tokens(x, indices, prefix);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    const at::Tensor grad = call_gather_tokens_backward(grads[0].contiguous(), indices,
                                                        ctx->saved_data["prefix"].toInt(),
                                                        ctx->saved_data["num_tokens"].toInt());
    return {grad, at::Tensor(), at::Tensor()};
  }
};

// ---- the Autograd kernels ----

at::Tensor sparsemax_autograd(const at::Tensor& x) { return SparsemaxFunction::apply(x); }

at::Tensor sparsemax_backward_autograd(const at::Tensor& p, const at::Tensor& grad) {
  return SparsemaxBackwardFunction::apply(p, grad);
}

TopTauOutputs top_tau_autograd(const at::Tensor& logits, const OptionalTensor& k, int64_t k_max,
                               const OptionalTensor& valid, bool largest, bool ties_authors,
                               const OptionalTensor& blur_kernel, int64_t grid_h, int64_t grid_w, bool need_attention,
                               bool int32_indices) {
  const bool keep_attention = at::GradMode::is_enabled() && logits.requires_grad();
  const variable_list out = TopTauFunction::apply(logits, k, k_max, valid, largest, ties_authors, blur_kernel, grid_h,
                                                  grid_w, need_attention, int32_indices, keep_attention);
  return {out[0], out[1], out[2], out[3]};
}

at::Tensor gather_tokens_autograd(const at::Tensor& x, const at::Tensor& indices, int64_t prefix) {
  return GatherTokensFunction::apply(x, indices, prefix);
}

at::Tensor gather_tokens_backward_autograd(const at::Tensor& grad, const at::Tensor& indices, int64_t prefix,
                                           int64_t num_tokens) {
  return GatherTokensBackwardFunction::apply(grad, indices, prefix, num_tokens);
}

}  // namespace

TORCH_LIBRARY_IMPL(sopfast, Autograd, m) {
  m.impl("sparsemax", TORCH_FN(sparsemax_autograd));
  m.impl("sparsemax_backward", TORCH_FN(sparsemax_backward_autograd));
  m.impl("top_tau", TORCH_FN(top_tau_autograd));
  m.impl("gather_tokens", TORCH_FN(gather_tokens_autograd));
  m.impl("gather_tokens_backward", TORCH_FN(gather_tokens_backward_autograd));
}

}  // namespace sopfast
