// Raw-pointer CPU kernels of top_tau: blur -> softmax -> top-k -> mask, indices, lam, and its
// backward (no torch dependency).  scalar_t is the logits' storage type, acc_t (float or
// double) the math type of the blurred logits, attention and lam.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/lanes.h"
#include "sopfast_common.h"

namespace sopfast::cpu {

// Shape and options shared by every row of one top_tau call.
template <typename acc_t>
struct TopTauProblem {
  int64_t d = 0;                       // features per row
  int64_t k_max = 0;                   // columns of indices
  bool largest = true;                 // keep the largest (else the smallest) logits
  const acc_t* blur_kernel = nullptr;  // [blur_size] or nullptr: no blur
  int64_t blur_size = 0;
  int64_t grid_h = 0, grid_w = 0;  // both > 0: 2-D blur on [grid_h, grid_w]; else 1-D along d

  bool blurs() const { return blur_kernel != nullptr && blur_size > 0; }
  bool blurs_2d() const { return grid_h > 0 && grid_w > 0; }
};

// Per-thread scratch of the row kernels.
template <typename acc_t>
struct TopTauWorkspace {
  std::vector<acc_t> s, tmp;                              // [d] each
  std::vector<typename TopTauKeyType<acc_t>::type> keys;  // [d]
  std::vector<uint32_t> ranks;                            // [d]
  std::vector<int64_t> positions;                         // [d]
  explicit TopTauWorkspace(int64_t d) : s(d), tmp(d), keys(d), ranks(d), positions(d) {}
};

// dst[l, j] = sum_t kernel[t] * src[l, reflect(j + t - pad)] for `lines` contiguous lines of `len`.
template <typename acc_t>
void blur_lines(const acc_t* src, acc_t* dst, int64_t lines, int64_t len, const acc_t* kernel, int64_t ks) {
  const int64_t pad = ks / 2;
  for (int64_t l = 0; l < lines; ++l, src += len, dst += len) {
    for (int64_t j = 0; j < len; ++j) {
      acc_t acc = 0;
      if (j >= pad && j + pad < len) {
        for (int64_t t = 0; t < ks; ++t) acc += kernel[t] * src[j + t - pad];
      } else {
        for (int64_t t = 0; t < ks; ++t) acc += kernel[t] * src[reflect_index(j + t - pad, len)];
      }
      dst[j] = acc;
    }
  }
}

// The same blur along the first axis of src[len, width] (vectorises over width).
template <typename acc_t>
void blur_columns(const acc_t* src, acc_t* dst, int64_t len, int64_t width, const acc_t* kernel, int64_t ks) {
  const int64_t pad = ks / 2;
  for (int64_t r = 0; r < len; ++r) {
    acc_t* out = dst + r * width;
    std::fill(out, out + width, acc_t(0));
    for (int64_t t = 0; t < ks; ++t) {
      const acc_t* in = src + reflect_index(r + t - pad, len) * width;
      const acc_t w = kernel[t];
      for (int64_t c = 0; c < width; ++c) out[c] += w * in[c];
    }
  }
}

// Transpose of blur_lines: dst[l, reflect(j + t - pad)] += kernel[t] * src[l, j].
template <typename acc_t>
void blur_lines_adjoint(const acc_t* src, acc_t* dst, int64_t lines, int64_t len, const acc_t* kernel, int64_t ks) {
  const int64_t pad = ks / 2;
  std::fill(dst, dst + lines * len, acc_t(0));
  for (int64_t l = 0; l < lines; ++l, src += len, dst += len) {
    for (int64_t j = 0; j < len; ++j) {
      for (int64_t t = 0; t < ks; ++t) dst[reflect_index(j + t - pad, len)] += kernel[t] * src[j];
    }
  }
}

// Transpose of blur_columns.
template <typename acc_t>
void blur_columns_adjoint(const acc_t* src, acc_t* dst, int64_t len, int64_t width, const acc_t* kernel, int64_t ks) {
  const int64_t pad = ks / 2;
  std::fill(dst, dst + len * width, acc_t(0));
  for (int64_t r = 0; r < len; ++r) {
    const acc_t* in = src + r * width;
    for (int64_t t = 0; t < ks; ++t) {
      acc_t* out = dst + reflect_index(r + t - pad, len) * width;
      const acc_t w = kernel[t];
      for (int64_t c = 0; c < width; ++c) out[c] += w * in[c];
    }
  }
}

// The (optionally blurred) logits of one row in acc_t: the row itself, or ws.s.
template <typename scalar_t, typename acc_t>
const acc_t* top_tau_blurred_logits(const TopTauProblem<acc_t>& pb, const scalar_t* logits,
                                    TopTauWorkspace<acc_t>& ws) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    if (!pb.blurs()) return logits;
  }
  acc_t* s = ws.s.data();
  acc_t* tmp = ws.tmp.data();
  for (int64_t j = 0; j < pb.d; ++j) s[j] = static_cast<acc_t>(logits[j]);
  if (!pb.blurs()) return s;
  if (pb.blurs_2d()) {
    blur_lines(s, tmp, pb.grid_h, pb.grid_w, pb.blur_kernel, pb.blur_size);
    blur_columns(tmp, s, pb.grid_h, pb.grid_w, pb.blur_kernel, pb.blur_size);
  } else {
    blur_lines(s, tmp, 1, pb.d, pb.blur_kernel, pb.blur_size);
    std::copy(tmp, tmp + pb.d, s);
  }
  return s;
}

// exp(x) for the softmax's x <= 0, branch-free so that its loop vectorises: x = n ln2 + r with
// |r| <= ln2 / 2, Cephes' degree-6 polynomial for e^r, 2^n through the exponent bits.  Within
// 1 ulp of exp on [-87.3, 0]; exactly 1 at 0 and exactly 0 below -87.3 (where floats go subnormal).
inline float softmax_exp(float x) {
  constexpr float lowest = -87.33654f;
  const float clamped = x > lowest ? x : lowest;
  const int n = -static_cast<int>(0.5f - clamped * 1.44269504088896341f);  // round(x / ln2), x <= 0
  const float fn = static_cast<float>(n);
  const float r = (clamped - fn * 0.693359375f) - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x > lowest ? p * scale : 0.0f;
}

inline double softmax_exp(double x) { return std::exp(x); }

// attention[d] = softmax of s over the valid features (invalid -> 0).  A row holding +inf
// spreads the mass uniformly over its +inf entries; a row with NaN, or whose valid entries
// are all -inf, gives NaN everywhere (as torch.softmax does).
template <typename acc_t>
void top_tau_softmax(const acc_t* s, const bool* valid, int64_t d, acc_t* attention) {
  constexpr acc_t inf = std::numeric_limits<acc_t>::infinity();
  acc_t* a = attention;  // first the logits with invalid features at -inf
  if (valid == nullptr) {
    std::copy(s, s + d, a);
  } else {
    for (int64_t j = 0; j < d; ++j) a[j] = valid[j] ? s[j] : -inf;
  }
  const int32_t n_posinf = lane_sum<int32_t>(d, [a](int64_t j) { return int32_t{a[j] == inf}; });
  const int32_t n_nan = lane_sum<int32_t>(d, [a](int64_t j) { return int32_t{a[j] != a[j]}; });
  const acc_t max = lane_max<acc_t>(d, [a](int64_t j) { return a[j]; });
  if (n_posinf > 0) {
    const acc_t share = acc_t(1) / static_cast<acc_t>(n_posinf);
    for (int64_t j = 0; j < d; ++j) a[j] = a[j] == inf ? share : acc_t(0);
    return;
  }
  if (n_nan > 0 || max == -inf) {
    std::fill(a, a + d, std::numeric_limits<acc_t>::quiet_NaN());
    return;
  }
  for (int64_t j = 0; j < d; ++j) a[j] = softmax_exp(a[j] - max);
  const acc_t inv = acc_t(1) / lane_sum<acc_t>(d, [a](int64_t j) { return a[j]; });
  for (int64_t j = 0; j < d; ++j) a[j] *= inv;
}

// A threshold t for the kk largest of r[d] (1 <= kk <= d): either #{r >= t} == kk, or t is the
// kk-th largest value (#{r > t} < kk <= #{r >= t}; the caller breaks the ties at t).  Bisection
// over the 32-bit range with vectorised counts; the first case ends it after about log2(d) steps.
inline uint32_t top_tau_threshold(const uint32_t* r, int64_t d, int64_t kk) {
  uint64_t lo = 0, hi = uint64_t{1} << 32;  // #{r >= lo} >= kk > #{r >= hi}
  while (hi - lo > 1) {
    const uint64_t mid = (lo + hi) / 2;
    const uint32_t t = static_cast<uint32_t>(mid);
    int32_t count = 0;
    for (int64_t j = 0; j < d; ++j) count += r[j] >= t;
    if (count == kk) return t;
    if (count > kk) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return static_cast<uint32_t>(lo);
}

// Fast path of top_tau_select for float rows keeping only valid features (kk <= #valid): the
// key without its index field, r = 0 for invalid features and >= 1 for valid ones; the kk-th
// largest r is the threshold, and ties at the threshold go to the lower indices.
inline void top_tau_select_valid(const float* s, const bool* valid, bool largest, int64_t d, int64_t kk, bool* mask,
                                 uint32_t* r) {
  for (int64_t j = 0; j < d; ++j) {
    const uint32_t order = ordered_bits(s[j]);
    const uint32_t priority = largest ? order : ~order;  // 0 only for NaN with largest=false
    r[j] = (valid == nullptr || valid[j]) ? std::max(priority, 1u) : 0u;
  }
  const uint32_t threshold = top_tau_threshold(r, d, kk);
  int32_t at_least = 0, above = 0;
  for (int64_t j = 0; j < d; ++j) {
    at_least += r[j] >= threshold;
    above += r[j] > threshold;
  }
  if (at_least == kk) {  // no ties to break at the threshold
    for (int64_t j = 0; j < d; ++j) mask[j] = r[j] >= threshold;
    return;
  }
  int64_t ties_left = kk - above;
  for (int64_t j = 0; j < d; ++j) {
    const bool tie = r[j] == threshold && ties_left > 0;
    ties_left -= tie;
    mask[j] = r[j] > threshold || tie;
  }
}

// mask[d] = the min(max(k, 0), d) features with the largest top_tau_key (valid first, then by
// logit, ties to the lower index).  float rows that keep only valid features take the
// bisection fast path; otherwise the k-th largest full key is found by nth_element.  O(d).
template <typename acc_t>
void top_tau_select(const TopTauProblem<acc_t>& pb, const acc_t* s, const bool* valid, int64_t k, bool* mask,
                    TopTauWorkspace<acc_t>& ws) {
  const int64_t d = pb.d;
  const int64_t kk = std::min(std::max<int64_t>(k, 0), d);
  if (kk == 0 || kk == d) {
    std::fill(mask, mask + d, kk == d);
    return;
  }
  if constexpr (std::is_same_v<acc_t, float>) {
    const int64_t n_valid = valid == nullptr ? d : std::count(valid, valid + d, true);
    if (kk <= n_valid) return top_tau_select_valid(s, valid, pb.largest, d, kk, mask, ws.ranks.data());
  }
  auto key = [&](int64_t j) { return top_tau_key(s[j], valid == nullptr || valid[j], pb.largest, j); };
  auto* keys = ws.keys.data();
  for (int64_t j = 0; j < d; ++j) keys[j] = key(j);
  std::nth_element(keys, keys + (kk - 1), keys + d, std::greater<>());
  const auto threshold = keys[kk - 1];
  for (int64_t j = 0; j < d; ++j) mask[j] = key(j) >= threshold;
}

// indices[k_max] = the positions of mask[d] in ascending order, -1 padded at the end;
// positions[d] is scratch (the loop stores every j and advances on kept ones: no branches).
inline void top_tau_write_indices(const bool* mask, int64_t d, int64_t k_max, int64_t* indices, int64_t* positions) {
  int64_t count = 0;
  for (int64_t j = 0; j < d; ++j) {
    positions[count] = j;
    count += mask[j];
  }
  count = std::min(count, k_max);
  std::copy(positions, positions + count, indices);
  std::fill(indices + count, indices + k_max, int64_t{-1});
}

// One row of the forward: logits[d] (+ valid[d] or nullptr) and its count k ->
// indices[k_max], mask[d], lam (= 2 * sum_{mask} attention - 1), attention[d].
template <typename scalar_t, typename acc_t>
void top_tau_forward_row(const TopTauProblem<acc_t>& pb, const scalar_t* logits, const bool* valid, int64_t k,
                         int64_t* indices, bool* mask, acc_t* lam, acc_t* attention, TopTauWorkspace<acc_t>& ws) {
  const acc_t* s = top_tau_blurred_logits(pb, logits, ws);
  top_tau_softmax(s, valid, pb.d, attention);
  top_tau_select(pb, s, valid, k, mask, ws);
  top_tau_write_indices(mask, pb.d, pb.k_max, indices, ws.positions.data());
  *lam = 2 * lane_sum<acc_t>(pb.d, [&](int64_t j) { return mask[j] ? attention[j] : acc_t(0); }) - 1;
}

// One row of the backward: grad_logits[d] = blur^T(a * (grad_lam * (sigma - lam) + (ga - <a, ga>)))
// with sigma = +1 in the mask and -1 outside; grad_attention (ga) may be nullptr.
template <typename acc_t>
void top_tau_backward_row(const TopTauProblem<acc_t>& pb, const acc_t* attention, const bool* mask, acc_t lam,
                          acc_t grad_lam, const acc_t* grad_attention, acc_t* grad_logits, TopTauWorkspace<acc_t>& ws) {
  const int64_t d = pb.d;
  acc_t* g = pb.blurs() ? ws.s.data() : grad_logits;
  for (int64_t j = 0; j < d; ++j) g[j] = attention[j] * (grad_lam * ((mask[j] ? acc_t(1) : acc_t(-1)) - lam));
  if (grad_attention != nullptr) {
    const acc_t dot = lane_sum<acc_t>(d, [&](int64_t j) { return attention[j] * grad_attention[j]; });
    for (int64_t j = 0; j < d; ++j) g[j] += attention[j] * (grad_attention[j] - dot);
  }
  if (!pb.blurs()) return;
  if (pb.blurs_2d()) {
    blur_columns_adjoint(g, ws.tmp.data(), pb.grid_h, pb.grid_w, pb.blur_kernel, pb.blur_size);
    blur_lines_adjoint(ws.tmp.data(), grad_logits, pb.grid_h, pb.grid_w, pb.blur_kernel, pb.blur_size);
  } else {
    blur_lines_adjoint(g, grad_logits, 1, d, pb.blur_kernel, pb.blur_size);
  }
}

// Rows [begin, end) of the forward over logits[N, d], valid[N, d] (or nullptr), k[N].
template <typename scalar_t, typename acc_t>
void top_tau_forward_rows(const TopTauProblem<acc_t>& pb, const scalar_t* logits, const bool* valid, const int64_t* k,
                          int64_t* indices, bool* mask, acc_t* lam, acc_t* attention, int64_t begin, int64_t end) {
  TopTauWorkspace<acc_t> ws(pb.d);
  const int64_t d = pb.d;
  for (int64_t r = begin; r < end; ++r) {
    top_tau_forward_row(pb, logits + r * d, valid == nullptr ? nullptr : valid + r * d, k[r], indices + r * pb.k_max,
                        mask + r * d, lam + r, attention + r * d, ws);
  }
}

// Rows [begin, end) of the backward; grad_attention[N, d] may be nullptr.
template <typename acc_t>
void top_tau_backward_rows(const TopTauProblem<acc_t>& pb, const acc_t* attention, const bool* mask, const acc_t* lam,
                           const acc_t* grad_lam, const acc_t* grad_attention, acc_t* grad_logits, int64_t begin,
                           int64_t end) {
  TopTauWorkspace<acc_t> ws(pb.d);
  const int64_t d = pb.d;
  for (int64_t r = begin; r < end; ++r) {
    top_tau_backward_row(pb, attention + r * d, mask + r * d, lam[r], grad_lam[r],
                         grad_attention == nullptr ? nullptr : grad_attention + r * d, grad_logits + r * d, ws);
  }
}

}  // namespace sopfast::cpu
