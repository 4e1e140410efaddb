// The Python module sopfast._C: every kernel of csrc/ops.h called directly, as <op>_<direction>_<device>,
// for the CPU and, in CUDA builds (SOPFAST_WITH_CUDA), for CUDA -- the backends' implementations that
// tests, benchmarks and sopfast.ops.use_backend reach.  The ops run through PyTorch's dispatcher
// (csrc/registration.cpp, csrc/autograd.cpp); importing this module registers them there.
#include <torch/extension.h>

#include <string>

#include "cpu/denormals.h"
#include "ops.h"

namespace {

bool has_cuda() {
#ifdef SOPFAST_WITH_CUDA
  return true;
#else
  return false;
#endif
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
  bind_device_ops<c10::kCPU>(m, "cpu");
#ifdef SOPFAST_WITH_CUDA
  bind_device_ops<c10::kCUDA>(m, "cuda");
#endif
}
