// Reductions over value(j), j < n, kept in kLanes interleaved partial results: independent
// dependency chains that the compiler vectorises (a plain loop chains every addition).  The
// order of the operations is fixed, so results are deterministic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace sopfast::cpu {

constexpr int64_t kLanes = 8;

// sum_{j < n} value(j) in T (an integer type counts).
template <typename T, typename F>
T lane_sum(int64_t n, F value) {
  T partial[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) partial[l] += value(j + l);
  }
  for (; j < n; ++j) partial[0] += value(j);
  T total = 0;
  for (int64_t l = 0; l < kLanes; ++l) total += partial[l];
  return total;
}

// max_{j < n} value(j), ignoring NaN; -inf when n == 0 or every value is NaN.
template <typename T, typename F>
T lane_max(int64_t n, F value) {
  T partial[kLanes];
  std::fill(partial, partial + kLanes, -std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const T v = value(j + l);
      partial[l] = v > partial[l] ? v : partial[l];
    }
  }
  for (; j < n; ++j) {
    const T v = value(j);
    partial[0] = v > partial[0] ? v : partial[0];
  }
  return *std::max_element(partial, partial + kLanes);
}

}  // namespace sopfast::cpu
