// The Python module sopfast._C: the CPU kernels, and in CUDA builds (SOPFAST_WITH_CUDA) the
// CUDA kernels under the same names with a _cuda suffix.
#include <torch/extension.h>

#include "cpu/ops_cpu.h"
#ifdef SOPFAST_WITH_CUDA
#include "cuda/ops_cuda.h"
#endif

namespace {

bool has_cuda() {
#ifdef SOPFAST_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() = "sopfast native kernels (sparsemax, top_tau, gather_tokens)";
  m.def("has_cuda", &has_cuda, "True when the module was built with the CUDA kernels");
  m.def("sparsemax_forward", &sopfast::sparsemax_forward_cpu, py::arg("x"));
  m.def("sparsemax_backward", &sopfast::sparsemax_backward_cpu, py::arg("p"), py::arg("grad"));
  m.def("top_tau_forward", &sopfast::top_tau_forward_cpu, py::arg("logits"), py::arg("k"), py::arg("k_max"),
        py::arg("valid"), py::arg("largest"), py::arg("blur_kernel"), py::arg("grid_h"), py::arg("grid_w"));
  m.def("top_tau_backward", &sopfast::top_tau_backward_cpu, py::arg("attention"), py::arg("mask"), py::arg("lam"),
        py::arg("grad_lam"), py::arg("grad_attention"), py::arg("blur_kernel"), py::arg("grid_h"), py::arg("grid_w"));
  m.def("gather_tokens_forward", &sopfast::gather_tokens_forward_cpu, py::arg("x"), py::arg("indices"),
        py::arg("prefix"));
  m.def("gather_tokens_backward", &sopfast::gather_tokens_backward_cpu, py::arg("grad"), py::arg("indices"),
        py::arg("prefix"), py::arg("num_tokens"));
#ifdef SOPFAST_WITH_CUDA
  m.def("sparsemax_forward_cuda", &sopfast::sparsemax_forward_cuda, py::arg("x"));
  m.def("sparsemax_backward_cuda", &sopfast::sparsemax_backward_cuda, py::arg("p"), py::arg("grad"));
  m.def("top_tau_forward_cuda", &sopfast::top_tau_forward_cuda, py::arg("logits"), py::arg("k"), py::arg("k_max"),
        py::arg("valid"), py::arg("largest"), py::arg("blur_kernel"), py::arg("grid_h"), py::arg("grid_w"));
  m.def("top_tau_backward_cuda", &sopfast::top_tau_backward_cuda, py::arg("attention"), py::arg("mask"), py::arg("lam"),
        py::arg("grad_lam"), py::arg("grad_attention"), py::arg("blur_kernel"), py::arg("grid_h"), py::arg("grid_w"));
  m.def("gather_tokens_forward_cuda", &sopfast::gather_tokens_forward_cuda, py::arg("x"), py::arg("indices"),
        py::arg("prefix"));
  m.def("gather_tokens_backward_cuda", &sopfast::gather_tokens_backward_cuda, py::arg("grad"), py::arg("indices"),
        py::arg("prefix"), py::arg("num_tokens"));
#endif
}
