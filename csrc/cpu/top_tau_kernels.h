// Raw-pointer CPU kernels of top_tau: blur -> softmax -> top-k -> mask, indices, lam, and its
// backward (no torch dependency).  scalar_t is the logits' storage type, acc_t (float or
// double) the math type of the blurred logits, attention and lam.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "sopfast_common.h"

namespace sopfast::cpu {

// Shape and options shared by every row of one top_tau call.
template <typename acc_t>
struct TopTauProblem {
  int64_t d = 0;                        // features per row
  int64_t k_max = 0;                    // columns of indices
  bool largest = true;                  // keep the largest (else the smallest) logits
  const acc_t* blur_kernel = nullptr;   // [blur_size] or nullptr: no blur
  int64_t blur_size = 0;
  int64_t grid_h = 0, grid_w = 0;       // both > 0: 2-D blur on [grid_h, grid_w]; else 1-D along d

  bool blurs() const { return blur_kernel != nullptr && blur_size > 0; }
  bool blurs_2d() const { return grid_h > 0 && grid_w > 0; }
};

// Per-thread scratch of the row kernels.
template <typename acc_t>
struct TopTauWorkspace {
  std::vector<acc_t> s, tmp;                                 // [d] each
  std::vector<typename TopTauKeyType<acc_t>::type> keys;     // [d]
  explicit TopTauWorkspace(int64_t d) : s(d), tmp(d), keys(d) {}
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

// s[d] = the (optionally blurred) logits of one row in acc_t; returns ws.s.
template <typename scalar_t, typename acc_t>
acc_t* top_tau_blurred_logits(const TopTauProblem<acc_t>& pb, const scalar_t* logits, TopTauWorkspace<acc_t>& ws) {
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

// attention[d] = softmax of s over the valid features (invalid -> 0).  A row holding +inf
// spreads the mass uniformly over its +inf entries; a row with NaN, or whose valid entries
// are all -inf, gives NaN everywhere (as torch.softmax does).
template <typename acc_t>
void top_tau_softmax(const acc_t* s, const bool* valid, int64_t d, acc_t* attention) {
  constexpr acc_t inf = std::numeric_limits<acc_t>::infinity();
  acc_t max = -inf;
  int64_t n_posinf = 0;
  bool has_nan = false;
  for (int64_t j = 0; j < d; ++j) {
    if (valid != nullptr && !valid[j]) continue;
    const acc_t v = s[j];
    max = v > max ? v : max;
    n_posinf += v == inf;
    has_nan |= v != v;
  }
  if (n_posinf > 0) {
    const acc_t share = acc_t(1) / static_cast<acc_t>(n_posinf);
    for (int64_t j = 0; j < d; ++j) attention[j] = (valid == nullptr || valid[j]) && s[j] == inf ? share : acc_t(0);
    return;
  }
  if (has_nan || max == -inf) {
    std::fill(attention, attention + d, std::numeric_limits<acc_t>::quiet_NaN());
    return;
  }
  acc_t sum = 0;
  for (int64_t j = 0; j < d; ++j) {
    const acc_t e = (valid == nullptr || valid[j]) ? std::exp(s[j] - max) : acc_t(0);
    attention[j] = e;
    sum += e;
  }
  const acc_t inv = acc_t(1) / sum;
  for (int64_t j = 0; j < d; ++j) attention[j] *= inv;
}

// mask[d] = the min(max(k, 0), d) features with the largest top_tau_key (valid first, then by
// logit, ties to the lower index): the k-th largest key is found by nth_element, O(d).
template <typename acc_t>
void top_tau_select(const TopTauProblem<acc_t>& pb, const acc_t* s, const bool* valid, int64_t k, bool* mask,
                    TopTauWorkspace<acc_t>& ws) {
  const int64_t d = pb.d;
  const int64_t kk = std::min(std::max<int64_t>(k, 0), d);
  if (kk == 0 || kk == d) {
    std::fill(mask, mask + d, kk == d);
    return;
  }
  auto key = [&](int64_t j) { return top_tau_key(s[j], valid == nullptr || valid[j], pb.largest, j); };
  auto* keys = ws.keys.data();
  for (int64_t j = 0; j < d; ++j) keys[j] = key(j);
  std::nth_element(keys, keys + (kk - 1), keys + d, std::greater<>());
  const auto threshold = keys[kk - 1];
  for (int64_t j = 0; j < d; ++j) mask[j] = key(j) >= threshold;
}

// indices[k_max] = the positions of mask[d] in ascending order, -1 padded at the end.
inline void top_tau_write_indices(const bool* mask, int64_t d, int64_t k_max, int64_t* indices) {
  int64_t count = 0;
  for (int64_t j = 0; j < d && count < k_max; ++j) {
    if (mask[j]) indices[count++] = j;
  }
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
  top_tau_write_indices(mask, pb.d, pb.k_max, indices);
  acc_t kept = 0;
  for (int64_t j = 0; j < pb.d; ++j) kept += mask[j] ? attention[j] : acc_t(0);
  *lam = 2 * kept - 1;
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
    acc_t dot = 0;
    for (int64_t j = 0; j < d; ++j) dot += attention[j] * grad_attention[j];
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
    top_tau_forward_row(pb, logits + r * d, valid == nullptr ? nullptr : valid + r * d, k[r],
                        indices + r * pb.k_max, mask + r * d, lam + r, attention + r * d, ws);
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
