// The Python module sopfast._C: every kernel of csrc/ops.h called directly, as <op>_<direction>_<device>,
// for the CPU and, in CUDA builds (SOPFAST_WITH_CUDA), for CUDA -- the backends' implementations that
// tests, benchmarks and sopfast.ops.use_backend reach -- and their argument checks, as check_<op>_<direction>
// (csrc/op_checks.h).  The ops run through PyTorch's dispatcher
// (csrc/registration.cpp, csrc/autograd.cpp); importing this module registers them there.
#include <torch/extension.h>

#include <optional>
#include <string>

#include "cpu/denormals.h"
#include "op_checks.h"
#include "ops.h"

namespace {

bool has_cuda() {
#ifdef SOPFAST_WITH_CUDA
  return true;
#else
  return false;
#endif
}

using OptionalTensor = std::optional<at::Tensor>;

// The checks of every entry point, for the kernels registered in Python (the references, Triton,
// the fake/Meta kernels): check_<kernel>(the kernel's arguments..., values=True), on the first
// input's device; values=False skips the checks that read tensor values (fake tensors hold none).
void bind_checks(pybind11::module_& m) {
  namespace py = pybind11;
  m.def(
      "check_sparsemax_forward",
      [](const at::Tensor& x, bool) { sopfast::check_sparsemax_forward(x, x.device().type()); }, py::arg("x"),
      py::kw_only(), py::arg("values") = true);
  m.def(
      "check_sparsemax_backward",
      [](const at::Tensor& p, const at::Tensor& grad, bool) {
        sopfast::check_sparsemax_backward(p, grad, p.device().type());
      },
      py::arg("p"), py::arg("grad"), py::kw_only(), py::arg("values") = true);
  m.def(
      "check_top_tau_forward",
      [](const at::Tensor& logits, const OptionalTensor& k, int64_t k_max, const OptionalTensor& valid, bool, bool,
         const OptionalTensor& blur_kernel, int64_t grid_h, int64_t grid_w, bool, bool, bool values) {
        sopfast::check_top_tau_forward(logits, k, k_max, valid, blur_kernel, grid_h, grid_w, logits.device().type(),
                                       values);
      },
      py::arg("logits"), py::arg("k"), py::arg("k_max"), py::arg("valid"), py::arg("largest"), py::arg("ties_authors"),
      py::arg("blur_kernel"), py::arg("grid_h"), py::arg("grid_w"), py::arg("need_attention") = true,
      py::arg("int32_indices") = false, py::kw_only(), py::arg("values") = true);
  m.def(
      "check_top_tau_backward",
      [](const at::Tensor& attention, const at::Tensor& mask, const at::Tensor& lam, const at::Tensor& grad_lam,
         const OptionalTensor& grad_attention, const OptionalTensor& blur_kernel, int64_t grid_h, int64_t grid_w,
         bool) {
        sopfast::check_top_tau_backward(attention, mask, lam, grad_lam, grad_attention, blur_kernel, grid_h, grid_w,
                                        attention.device().type());
      },
      py::arg("attention"), py::arg("mask"), py::arg("lam"), py::arg("grad_lam"), py::arg("grad_attention"),
      py::arg("blur_kernel"), py::arg("grid_h"), py::arg("grid_w"), py::kw_only(), py::arg("values") = true);
  m.def(
      "check_gather_tokens_forward",
      [](const at::Tensor& x, const at::Tensor& indices, int64_t prefix, bool values) {
        sopfast::check_gather_tokens_forward(x, indices, prefix, x.device().type(), values);
      },
      py::arg("x"), py::arg("indices"), py::arg("prefix"), py::kw_only(), py::arg("values") = true);
  m.def(
      "check_gather_tokens_backward",
      [](const at::Tensor& grad, const at::Tensor& indices, int64_t prefix, int64_t num_tokens, bool values) {
        sopfast::check_gather_tokens_backward(grad, indices, prefix, num_tokens, grad.device().type(), values);
      },
      py::arg("grad"), py::arg("indices"), py::arg("prefix"), py::arg("num_tokens"), py::kw_only(),
      py::arg("values") = true);
}

// Binds the entry points of one device, named <op>_<direction>_<device>.
template <c10::DeviceType kDevice>
void bind_device_ops(pybind11::module_& m, const std::string& device) {
  namespace py = pybind11;
  auto name = [&device](const char* op) { return std::string(op) + "_" + device; };
  m.def(name("sparsemax_forward").c_str(), &sopfast::sparsemax_forward<kDevice>, py::arg("x"));
  m.def(name("sparsemax_backward").c_str(), &sopfast::sparsemax_backward<kDevice>, py::arg("p"), py::arg("grad"));
  m.def(name("top_tau_forward").c_str(), &sopfast::top_tau_forward<kDevice>, py::arg("logits"), py::arg("k"),
        py::arg("k_max"), py::arg("valid"), py::arg("largest"), py::arg("ties_authors"), py::arg("blur_kernel"),
        py::arg("grid_h"), py::arg("grid_w"), py::arg("need_attention") = true, py::arg("int32_indices") = false);
  m.def(name("top_tau_backward").c_str(), &sopfast::top_tau_backward<kDevice>, py::arg("attention"), py::arg("mask"),
        py::arg("lam"), py::arg("grad_lam"), py::arg("grad_attention"), py::arg("blur_kernel"), py::arg("grid_h"),
        py::arg("grid_w"));
  m.def(name("gather_tokens_forward").c_str(), &sopfast::gather_tokens_forward<kDevice>, py::arg("x"),
        py::arg("indices"), py::arg("prefix"));
  m.def(name("gather_tokens_backward").c_str(), &sopfast::gather_tokens_backward<kDevice>, py::arg("grad"),
        py::arg("indices"), py::arg("prefix"), py::arg("num_tokens"));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "sopfast native kernels (sparsemax, top_tau, gather_tokens): <op>_<direction>_<cpu|cuda>";
  m.def("has_cuda", &has_cuda, "True when the module was built with the CUDA kernels");
  m.def("intra_op_threads_flushing", &sopfast::intra_op_threads_flushing,
        "Whether each intra-op thread flushes subnormal floats now, [torch.get_num_threads()] (0: the caller)");
  m.def("set_intra_op_threads_flushing", &sopfast::set_intra_op_threads_flushing, pybind11::arg("states"),
        "Set intra-op thread i to flush subnormal floats per states[i] (the last entry for the rest); False "
        "where the CPU cannot");
  bind_checks(m);
  bind_device_ops<c10::kCPU>(m, "cpu");
#ifdef SOPFAST_WITH_CUDA
  bind_device_ops<c10::kCUDA>(m, "cuda");
#endif
}
