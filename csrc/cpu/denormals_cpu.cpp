#include "cpu/denormals.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cfloat>

namespace sopfast {
namespace {

// Runs fn(thread) once on each intra-op thread: at::parallel_for over one item per thread with grain 1
// hands thread i the range [i, i + 1) (ATen/ParallelOpenMP.h), and runs on the caller alone when the
// pool has one thread or the caller is already inside a parallel region.
template <typename Fn>
void on_each_intra_op_thread(Fn fn) {
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      fn(i);
    }
  });
}

bool flushing() {
  volatile float smallest = FLT_MIN;
  return smallest * 0.5f == 0.0f;
}

}  // namespace

std::vector<bool> intra_op_threads_flushing() {
  std::vector<char> found(static_cast<size_t>(at::get_num_threads()), 0);
  on_each_intra_op_thread([&found](int64_t i) { found[static_cast<size_t>(i)] = flushing() ? 1 : 0; });
  return std::vector<bool>(found.begin(), found.end());
}

bool set_intra_op_threads_flushing(const std::vector<bool>& states) {
  TORCH_CHECK(!states.empty(), "set_intra_op_threads_flushing: states is empty; give one flag per thread");
  if (!at::globalContext().setFlushDenormal(flushing())) {  // unchanged: only asks whether the CPU can

    return false;
  }
  const int64_t last = static_cast<int64_t>(states.size()) - 1;
  on_each_intra_op_thread(
      [&states, last](int64_t i) { at::globalContext().setFlushDenormal(states[static_cast<size_t>(std::min(i, last))]); });
  return true;
}

}  // namespace sopfast
