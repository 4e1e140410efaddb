// Raw-pointer CPU kernels of sparsemax over rows x[N, n] (no torch dependency).
//
// scalar_t is the storage type (float, double, or a 16-bit float convertible to float);
// acc_t the math type (float, or double for double).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cpu/lanes.h"

namespace sopfast::cpu {

// (sum, count) of the entries of z[n] above tau: kLanes-wide for long arrays, one plain pass for
// the few entries a row usually keeps.
template <typename acc_t>
std::pair<acc_t, int32_t> sparsemax_sum_above(const acc_t* z, int64_t n, acc_t tau) {
  if (n >= 4 * kLanes) {
    return {lane_sum<acc_t>(n, [&](int64_t i) { return z[i] > tau ? z[i] : acc_t(0); }),
            lane_sum<int32_t>(n, [&](int64_t i) { return int32_t{z[i] > tau}; })};
  }
  acc_t sum = 0;
  int32_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool above = z[i] > tau;
    sum += above ? z[i] : acc_t(0);
    count += above;
  }
  return {sum, count};
}

// Sparsemax threshold tau of a row whose maximum is 0, given z[n] = the row's entries above -1
// (a superset of the support, since tau >= max - 1): the tau with sum_i max(z_i - tau, 0) = 1.
// Michelot's algorithm: tau <- (sum_{z > tau} z - 1) / #{z > tau} from tau = -1 until the
// support stops shrinking; exact and sort-free.  tau never decreases, so the support is nested
// and the iteration ends (in fp too).
template <typename acc_t>
acc_t sparsemax_threshold(const acc_t* z, int64_t n) {
  acc_t tau = -1;
  int32_t size = -1;
  while (true) {
    const auto [sum, count] = sparsemax_sum_above(z, n, tau);
    if (count == size) return tau;
    size = count;
    tau = std::max(tau, (sum - 1) / static_cast<acc_t>(count));
  }
}

// p[n] = sparsemax(x[n]); work[n] is scratch.  A row without a result (a NaN, or only -inf) gives
// NaN everywhere; otherwise rows with +inf put uniform mass on their +inf entries.
template <typename scalar_t, typename acc_t>
void sparsemax_forward_row(const scalar_t* x, scalar_t* p, int64_t n, acc_t* work) {
  constexpr acc_t inf = std::numeric_limits<acc_t>::infinity();
  auto at = [x](int64_t i) { return static_cast<acc_t>(x[i]); };
  const acc_t max = lane_max<acc_t>(n, at);  // ignores NaN
  const int32_t n_nan = lane_sum<int32_t>(n, [&](int64_t i) { return int32_t{at(i) != at(i)}; });
  if (n_nan > 0 || max == -inf) {
    std::fill(p, p + n, static_cast<scalar_t>(std::numeric_limits<acc_t>::quiet_NaN()));
    return;
  }
  if (max == inf) {
    const int32_t n_posinf = lane_sum<int32_t>(n, [&](int64_t i) { return int32_t{at(i) == inf}; });
    const acc_t share = acc_t(1) / static_cast<acc_t>(n_posinf);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(at(i) == inf ? share : acc_t(0));
    return;
  }
  int64_t size = 0;  // work[:size] = the shifted entries above -1 (branch-free compaction)
  for (int64_t i = 0; i < n; ++i) {
    const acc_t z = at(i) - max;
    work[size] = z;
    size += z > acc_t(-1);
  }
  const acc_t tau = sparsemax_threshold(work, size);
  for (int64_t i = 0; i < n; ++i) {
    const acc_t v = at(i) - max - tau;
    p[i] = static_cast<scalar_t>(v > 0 ? v : acc_t(0));
  }
}

// grad_x[n] = (g - mean_S g) on S = {p > 0}, 0 elsewhere.
template <typename scalar_t, typename acc_t>
void sparsemax_backward_row(const scalar_t* p, const scalar_t* g, scalar_t* grad_x, int64_t n) {
  auto in_support = [p](int64_t i) { return static_cast<acc_t>(p[i]) > acc_t(0); };
  const acc_t sum = lane_sum<acc_t>(n, [&](int64_t i) { return in_support(i) ? static_cast<acc_t>(g[i]) : acc_t(0); });
  const int32_t size = lane_sum<int32_t>(n, [&](int64_t i) { return int32_t{in_support(i)}; });
  const acc_t mean = sum / static_cast<acc_t>(std::max(size, 1));
  for (int64_t i = 0; i < n; ++i) {
    grad_x[i] = static_cast<scalar_t>(in_support(i) ? static_cast<acc_t>(g[i]) - mean : acc_t(0));
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
  for (int64_t r = begin; r < end; ++r) {
    sparsemax_backward_row<scalar_t, acc_t>(p + r * n, g + r * n, grad_x + r * n, n);
  }
}

}  // namespace sopfast::cpu
