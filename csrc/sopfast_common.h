// Helpers shared by the CPU (C++) and CUDA kernels: no torch, no CUDA runtime headers.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SOPFAST_HD __host__ __device__ __forceinline__
#else
#define SOPFAST_HD inline
#endif

namespace sopfast {

// Source position of padded position q in [-pad, len + pad) under reflect padding
// (torchvision / numpy "reflect": the edge is not repeated, -1 -> 1, len -> len - 2).
template <typename Int>
SOPFAST_HD Int reflect_index(Int q, Int len) {
  if (q < 0) q = -q;
  if (q >= len) q = 2 * (len - 1) - q;
  return q;
}

SOPFAST_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
#endif
}

SOPFAST_HD uint64_t double_bits(double v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
#endif
}

// Unsigned integers ordered like the floats, as torch.sort orders them: -0 == +0 and every
// NaN above +inf (the largest value).
SOPFAST_HD uint32_t ordered_bits(float v) {
  if (v != v) return 0xFFFFFFFFu;
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = float_bits(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

SOPFAST_HD uint64_t ordered_bits(double v) {
  if (v != v) return ~uint64_t{0};
  if (v == 0.0) v = 0.0;
  const uint64_t u = double_bits(v);
  return (u & (uint64_t{1} << 63)) ? ~u : (u | (uint64_t{1} << 63));
}

// Selection key of feature j in top_tau: a larger key ranks first.  Valid features rank
// before invalid ones, then by score (descending if `largest`, else ascending; NaN counts as
// the largest value, so it ranks first for `largest` and last otherwise), then by lower index
// (higher index when `higher_first`).  fp32 packs into 64 bits: [valid:1][priority:32][index:31]
// with index = 0x7FFFFFFF - j (or j); fp64 into 128 bits.
SOPFAST_HD uint64_t top_tau_key(float s, bool valid, bool largest, int64_t j, bool higher_first) {
  const uint32_t order = ordered_bits(s);
  const uint32_t priority = largest ? order : ~order;
  const uint64_t index = static_cast<uint64_t>(higher_first ? j : 0x7FFFFFFF - j);
  return (uint64_t{valid} << 63) | (uint64_t{priority} << 31) | index;
}

using Key128 = unsigned __int128;

SOPFAST_HD Key128 top_tau_key(double s, bool valid, bool largest, int64_t j, bool higher_first) {
  const uint64_t order = ordered_bits(s);
  const uint64_t priority = largest ? order : ~order;
  const Key128 index = static_cast<Key128>(higher_first ? j : 0x7FFFFFFF - j);
  return (Key128{valid} << 95) | (Key128{priority} << 31) | index;
}

// gather_tokens shapes: x [batch, tokens, embed], indices [batch, groups, keep] -> out
// [batch * groups, prefix + keep, embed].
struct GatherTokensShape {
  int64_t batch = 0;   // B
  int64_t tokens = 0;  // T
  int64_t embed = 0;   // E
  int64_t groups = 0;  // m
  int64_t keep = 0;    // k
  int64_t prefix = 0;  // always-kept leading tokens

  SOPFAST_HD int64_t slots() const { return prefix + keep; }  // rows per group in the output
};

// Largest feature count top_tau supports (the index field of the key has 31 bits).
constexpr int64_t kTopTauMaxFeatures = 0x7FFFFFFF;

template <typename acc_t>
struct TopTauKeyType;
template <>
struct TopTauKeyType<float> {
  using type = uint64_t;
};
template <>
struct TopTauKeyType<double> {
  using type = Key128;
};

}  // namespace sopfast
