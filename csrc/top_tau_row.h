// Per-row math of top_tau shared by the CPU kernels (g++) and the CUDA kernels (nvcc device
// code): the softmax's exp, the rank order of a score, and the threshold search of the top-k.
// Plain functions (SOPFAST_HD), no torch, no CUDA runtime: csrc/tests runs them on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "sopfast_common.h"

namespace sopfast {

SOPFAST_HD float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
#endif
}

SOPFAST_HD double double_from_bits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
#endif
}

// +inf and a quiet NaN (std::numeric_limits is host-only in device code without --expt-relaxed-constexpr).
template <typename T>
SOPFAST_HD T positive_infinity();
template <>
SOPFAST_HD float positive_infinity<float>() {
  return float_from_bits(0x7f800000u);
}
template <>
SOPFAST_HD double positive_infinity<double>() {
  return double_from_bits(0x7ff0000000000000ull);
}
template <typename T>
SOPFAST_HD T quiet_nan();
template <>
SOPFAST_HD float quiet_nan<float>() {
  return float_from_bits(0x7fc00000u);
}
template <>
SOPFAST_HD double quiet_nan<double>() {
  return double_from_bits(0x7ff8000000000000ull);
}

// A product the compiler may not fuse into an FMA (the CPU kernels round the same way).
SOPFAST_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SOPFAST_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// exp(x) for the softmax's x = logit - row max <= 0, branch-free so that CPU loops vectorise:
// x = n ln2 + r with |r| <= ln2 / 2, Cephes' degree-6 polynomial for e^r, 2^n through the exponent
// bits.  Within 1 ulp of exp on [-87.3, 0], exactly 1 at 0.  Subnormal results are kept, as
// torch's softmax keeps them (softmax([0, -90]) = [1, 8.19e-40]): below 2^-126 the scale is applied
// in two steps, 2^(n + 64) then 2^-64, so that the result is rounded once, into the subnormal
// grid.  Exactly 0 below -104 (where exp(x) < 2^-150 rounds to 0) and for -inf.
SOPFAST_HD float softmax_exp(float x) {
  constexpr float lowest = -104.0f;
  const float clamped = x > lowest ? x : lowest;
  const int n = -static_cast<int>(0.5f - clamped * 1.44269504088896341f);  // round(x / ln2) in [-150, 0]
  const float fn = static_cast<float>(n);
  const float r = (clamped - fn * 0.693359375f) - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const bool subnormal = n < -126;
  const float scale = float_from_bits(static_cast<uint32_t>((subnormal ? n + 64 : n) + 127) << 23);
  const float post = subnormal ? 5.42101086242752217e-20f : 1.0f;  // 2^-64
  return x > lowest ? (p * scale) * post : 0.0f;
}

SOPFAST_HD double softmax_exp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

// The score of the authors' tie rule (python/sopfast/ops/top_tau.py, authors_scores): the (blurred)
// logit s, or -inf where its exp underflows to 0 whatever the softmax's rounding: x = s - row_max <=
// SoftmaxZero::at, the largest x whose exp rounds to 0 (float: just below -150 ln 2, exp < 2^-150;
// double: -1075 ln 2).  That includes every finite logit of a row holding +inf (s - inf = -inf), while
// +inf itself stays (inf - inf is NaN).  Ranking these instead of the attention keeps the authors' order
// wherever their attention values differ, and makes the groups independent of how exp, the sum and the
// division round: every backend ranks the same bits.
template <typename acc_t>
struct SoftmaxZero;
template <>
struct SoftmaxZero<float> {
  static constexpr float at = -103.97208404541016f;
};
template <>
struct SoftmaxZero<double> {
  static constexpr double at = -745.1332191019412;
};

template <typename acc_t>
SOPFAST_HD acc_t authors_score(acc_t s, acc_t row_max) {
  return s - row_max <= SoftmaxZero<acc_t>::at ? -positive_infinity<acc_t>() : s;
}

// Rank priority of a score: a larger priority ranks first.  Scores ordered as torch.sort orders
// them (-0 == +0, every NaN above +inf), reversed when !largest.
SOPFAST_HD uint32_t rank_priority(float score, bool largest) {
  const uint32_t order = ordered_bits(score);
  return largest ? order : ~order;
}

SOPFAST_HD uint64_t rank_priority(double score, bool largest) {
  const uint64_t order = ordered_bits(score);
  return largest ? order : ~order;
}

// The score of a rank priority (rank_priority inverted: -0 comes back as +0, every NaN as one NaN).
SOPFAST_HD float score_from_priority(uint32_t priority, bool largest) {
  const uint32_t order = largest ? priority : ~priority;
  return float_from_bits((order & 0x80000000u) ? (order & 0x7FFFFFFFu) : ~order);
}

SOPFAST_HD double score_from_priority(uint64_t priority, bool largest) {
  const uint64_t sign = uint64_t{1} << 63;
  const uint64_t order = largest ? priority : ~priority;
  return double_from_bits((order & sign) ? (order & ~sign) : ~order);
}

template <typename acc_t>
struct RankPriorityType;
template <>
struct RankPriorityType<float> {
  using type = uint32_t;
};
template <>
struct RankPriorityType<double> {
  using type = uint64_t;
};

// Search for the k-th largest of a multiset of unsigned keys, from the top bit down, one count
// per step (the caller counts, e.g. with a vectorised loop or a warp ballot):
//
//   KthLargestSearch<uint32_t> search;
//   while (search.running()) search.step(#{key >= search.candidate()}, k);
//
// Needs 1 <= k <= #{keys}.  Afterwards `threshold` is the largest T with #{key >= T} >= k, i.e.
// the k-th largest key: #{key > T} < k <= #{key >= T}, and the caller breaks the ties at T.  The
// search ends early (`exact`) once #{key >= T} == k: {key >= T} is then exactly the top k.
template <typename Key>
struct KthLargestSearch {
  Key threshold = 0;
  Key bit = Key(1) << (8 * sizeof(Key) - 1);
  bool exact = false;

  SOPFAST_HD bool running() const { return bit != 0 && !exact; }
  SOPFAST_HD Key candidate() const { return threshold | bit; }
  // count = #{key >= candidate()}
  SOPFAST_HD void step(int64_t count, int64_t k) {
    if (count >= k) {
      threshold = candidate();
      exact = count == k;
    }
    bit >>= 1;
  }
};

// The same search deciding several bits per count, for teams of threads where each count is a
// team-wide sum (csrc/team_rows.h): a step counts #{key >= threshold | i << shift} for every digit i
// in [1, 2^bits) at once, each count in a field of `width` bits of one uint64 (the caller sums
// share(key) over the keys), and takes the largest digit whose count reaches k:
//
//   RadixSearch<uint32_t> search(n);   // n >= every count (the number of keys)
//   while (search.running()) search.step(sum of search.share(key), k);
//
// Bits per step: kMaxBits, fewer when 2^bits - 1 fields of bit_length(n) bits do not fit in 64.
template <typename Key>
struct RadixSearch {
  static constexpr int kMaxBits = 3;
  Key threshold = 0;
  int bits_left = 8 * sizeof(Key);
  int width = 1, bits = 1;
  uint64_t ones = 1;  // one count in every field
  bool exact = false;

  SOPFAST_HD explicit RadixSearch(int64_t n) {
    while ((int64_t{1} << width) <= n) ++width;
    while (bits < kMaxBits && ((1 << (bits + 1)) - 1) * width <= 64) ++bits;
    for (int i = 1; i < (1 << bits) - 1; ++i) ones |= uint64_t{1} << (width * i);
  }
  SOPFAST_HD bool running() const { return bits_left > 0 && !exact; }
  SOPFAST_HD int step_bits() const { return bits < bits_left ? bits : bits_left; }
  // The fields this key counts in: digits 1 .. its own (0 when below the threshold's prefix).
  SOPFAST_HD uint64_t share(Key key) const {
    const int shift = bits_left - step_bits();
    const Key top = (Key(1) << step_bits()) - 1;
    const Key high = key >> shift, base = threshold >> shift;  // base has its low step_bits() bits clear
    const Key digit = high < base ? Key(0) : (high > base + top ? top : high - base);
    const int fields = (1 << bits) - 1;
    return digit == 0 ? uint64_t{0} : ones >> (width * (fields - static_cast<int>(digit)));
  }
  // packed = the sum of share(key) over the keys
  SOPFAST_HD void step(uint64_t packed, int64_t k) {
    const int shift = bits_left - step_bits();
    const uint64_t field = (uint64_t{1} << width) - 1;
    int best = 0;
    int64_t best_count = 0;
    for (int i = 1; i < (1 << step_bits()); ++i) {
      const int64_t count = static_cast<int64_t>((packed >> (width * (i - 1))) & field);
      if (count >= k) best = i, best_count = count;
    }
    if (best > 0) {
      threshold |= Key(best) << shift;
      exact = best_count == k;
    }
    bits_left -= step_bits();
  }
};

// Features count: k clamped to [0, available].
SOPFAST_HD int64_t clamp_count(int64_t k, int64_t available) { return k < 0 ? 0 : (k > available ? available : k); }

}  // namespace sopfast
