// Raw-pointer CPU kernels of sparsemax over rows x[N, n] (no torch dependency).
//
// scalar_t is the storage type (float, double, or a 16-bit float convertible to float);
// acc_t the math type (float, or double for double).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace sopfast::cpu {

template <typename acc_t>
struct SparsemaxRowStats {
  acc_t max;          // largest non-NaN entry
  int64_t n_posinf;   // number of +inf entries
  bool has_nan;
};

template <typename scalar_t, typename acc_t>
SparsemaxRowStats<acc_t> sparsemax_row_stats(const scalar_t* x, int64_t n) {
  constexpr acc_t inf = std::numeric_limits<acc_t>::infinity();
  acc_t max = -inf;
  int64_t n_posinf = 0;
  bool has_nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const acc_t v = static_cast<acc_t>(x[i]);
    max = v > max ? v : max;
    n_posinf += v == inf;
    has_nan |= v != v;
  }
  return {max, n_posinf, has_nan};
}

// Sparsemax threshold tau of a row z[n] whose maximum is 0: the tau with
// sum_i max(z_i - tau, 0) = 1.  Michelot's algorithm: start from a superset of the support
// ({z > -1}, since tau >= max - 1), set tau = (sum_S z - 1) / |S| and drop the entries <= tau
// until none is dropped; exact and sort-free.  Overwrites z with the compacted support.
template <typename acc_t>
acc_t sparsemax_threshold(acc_t* z, int64_t n) {
  int64_t size = 0;
  acc_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const acc_t v = z[i];
    const bool keep = v > acc_t(-1);
    z[size] = v;
    size += keep;
    sum += keep ? v : acc_t(0);
  }
  acc_t tau = (sum - 1) / static_cast<acc_t>(size);
  while (true) {
    int64_t kept = 0;
    acc_t kept_sum = 0;
    for (int64_t i = 0; i < size; ++i) {
      const acc_t v = z[i];
      const bool keep = v > tau;
      z[kept] = v;
      kept += keep;
      kept_sum += keep ? v : acc_t(0);
    }
    if (kept == size) return tau;
    size = kept;
    tau = (kept_sum - 1) / static_cast<acc_t>(size);
  }
}

// p[n] = sparsemax(x[n]); work[n] is scratch.  Rows with +inf put uniform mass on their +inf
// entries; rows with NaN (and no +inf) or only -inf give NaN.
template <typename scalar_t, typename acc_t>
void sparsemax_forward_row(const scalar_t* x, scalar_t* p, int64_t n, acc_t* work) {
  const SparsemaxRowStats<acc_t> stats = sparsemax_row_stats<scalar_t, acc_t>(x, n);
  constexpr acc_t inf = std::numeric_limits<acc_t>::infinity();
  if (stats.n_posinf > 0) {
    const acc_t share = acc_t(1) / static_cast<acc_t>(stats.n_posinf);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(static_cast<acc_t>(x[i]) == inf ? share : acc_t(0));
    return;
  }
  if (stats.has_nan || stats.max == -inf) {
    std::fill(p, p + n, static_cast<scalar_t>(std::numeric_limits<acc_t>::quiet_NaN()));
    return;
  }
  for (int64_t i = 0; i < n; ++i) work[i] = static_cast<acc_t>(x[i]) - stats.max;
  const acc_t tau = sparsemax_threshold(work, n);
  for (int64_t i = 0; i < n; ++i) {
    const acc_t v = static_cast<acc_t>(x[i]) - stats.max - tau;
    p[i] = static_cast<scalar_t>(v > 0 ? v : acc_t(0));
  }
}

// grad_x[n] = (g - mean_S g) on S = {p > 0}, 0 elsewhere.
template <typename scalar_t, typename acc_t>
void sparsemax_backward_row(const scalar_t* p, const scalar_t* g, scalar_t* grad_x, int64_t n) {
  acc_t sum = 0;
  int64_t size = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool in_support = static_cast<acc_t>(p[i]) > 0;
    sum += in_support ? static_cast<acc_t>(g[i]) : acc_t(0);
    size += in_support;
  }
  const acc_t mean = sum / static_cast<acc_t>(std::max<int64_t>(size, 1));
  for (int64_t i = 0; i < n; ++i) {
    const bool in_support = static_cast<acc_t>(p[i]) > 0;
    grad_x[i] = static_cast<scalar_t>(in_support ? static_cast<acc_t>(g[i]) - mean : acc_t(0));
  }
}

// Rows [begin, end) of x[N, n] -> p[N, n].
template <typename scalar_t, typename acc_t>
void sparsemax_forward_rows(const scalar_t* x, scalar_t* p, int64_t n, int64_t begin, int64_t end) {
  std::vector<acc_t> work(static_cast<size_t>(n));
  for (int64_t r = begin; r < end; ++r) sparsemax_forward_row<scalar_t, acc_t>(x + r * n, p + r * n, n, work.data());
}

// Rows [begin, end) of the backward: p, g [N, n] -> grad_x [N, n].
template <typename scalar_t, typename acc_t>
void sparsemax_backward_rows(const scalar_t* p, const scalar_t* g, scalar_t* grad_x, int64_t n, int64_t begin,
                             int64_t end) {
  for (int64_t r = begin; r < end; ++r) sparsemax_backward_row<scalar_t, acc_t>(p + r * n, g + r * n, grad_x + r * n, n);
}

}  // namespace sopfast::cpu
