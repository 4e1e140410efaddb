// Raw-pointer CPU kernels of top_tau: blur -> softmax -> top-k -> mask, indices, lam, and its
// backward (no torch dependency).  scalar_t is the logits' storage type, acc_t (float or
// double) the math type of the blurred logits, attention and lam.  The row math shared with the
// CUDA kernels (exp, rank order, threshold search) is in top_tau_row.h.
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
#include "top_tau_row.h"

namespace sopfast::cpu {

// Shape and options shared by every row of one top_tau call.
template <typename acc_t>
struct TopTauProblem {
  int64_t d = 0;                       // features per row
  int64_t k_max = 0;                   // columns of indices
  bool largest = true;                 // keep the largest (else the smallest) scores
  bool ties_authors = false;           // rank authors_score (top_tau_row.h), equal ones higher index first
                                       // when largest (else the blurred logits, equal ones lower index first)
  const acc_t* blur_kernel = nullptr;  // [blur_size] or nullptr: no blur
  int64_t blur_size = 0;
  int64_t grid_h = 0, grid_w = 0;  // both > 0: 2-D blur on [grid_h, grid_w]; else 1-D along d

  bool blurs() const { return blur_kernel != nullptr && blur_size > 0; }
  bool blurs_2d() const { return grid_h > 0 && grid_w > 0; }
};

// Per-thread scratch of the row kernels (`attention`: the row's attention when the caller keeps none).
template <typename acc_t>
struct TopTauWorkspace {
  std::vector<acc_t> s, tmp, attention;                       // [d] each
  std::vector<typename TopTauKeyType<acc_t>::type> keys;       // [d]
  std::vector<typename RankPriorityType<acc_t>::type> ranks;  // [d]
  std::vector<int64_t> positions;                             // [d]
  explicit TopTauWorkspace(int64_t d, bool attention_rows = false)
      : s(d), tmp(d), attention(attention_rows ? d : 0), keys(d), ranks(d), positions(d) {}
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

// The (optionally blurred) logits of one row in acc_t: the row itself, or ws.s.  With a blur, sets
// `finite` to whether every logit of the row is finite (a blur mixes each with its neighbours).
template <typename scalar_t, typename acc_t>
const acc_t* top_tau_blurred_logits(const TopTauProblem<acc_t>& pb, const scalar_t* logits, TopTauWorkspace<acc_t>& ws,
                                    bool& finite) {
  finite = true;
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    if (!pb.blurs()) return logits;
  }
  acc_t* s = ws.s.data();
  acc_t* tmp = ws.tmp.data();
  for (int64_t j = 0; j < pb.d; ++j) s[j] = static_cast<acc_t>(logits[j]);
  if (!pb.blurs()) return s;
  finite = lane_sum<int32_t>(pb.d, [s](int64_t j) { return int32_t{!(s[j] - s[j] == acc_t(0))}; }) == 0;  // inf - inf is NaN
  if (pb.blurs_2d()) {
    blur_lines(s, tmp, pb.grid_h, pb.grid_w, pb.blur_kernel, pb.blur_size);
    blur_columns(tmp, s, pb.grid_h, pb.grid_w, pb.blur_kernel, pb.blur_size);
  } else {
    blur_lines(s, tmp, 1, pb.d, pb.blur_kernel, pb.blur_size);
    std::copy(tmp, tmp + pb.d, s);
  }
  return s;
}

// attention[d] = softmax of s over the valid features (invalid -> 0), and row_max = their maximum;
// returns whether the row has a result.  A row with NaN among its valid entries, or whose valid entries
// are all -inf, has none: NaN everywhere (as torch.softmax answers).  Otherwise a row holding +inf
// spreads the mass uniformly over its +inf entries.
template <typename acc_t>
bool top_tau_softmax(const acc_t* s, const bool* valid, int64_t d, acc_t* attention, acc_t& row_max) {
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
  row_max = max;
  if (n_nan > 0 || max == -inf) {
    std::fill(a, a + d, std::numeric_limits<acc_t>::quiet_NaN());
    return false;
  }
  if (n_posinf > 0) {
    const acc_t share = acc_t(1) / static_cast<acc_t>(n_posinf);
    for (int64_t j = 0; j < d; ++j) a[j] = a[j] == inf ? share : acc_t(0);
    return true;
  }
  for (int64_t j = 0; j < d; ++j) a[j] = softmax_exp(a[j] - max);
  const acc_t inv = acc_t(1) / lane_sum<acc_t>(d, [a](int64_t j) { return a[j]; });
  for (int64_t j = 0; j < d; ++j) a[j] *= inv;
  return true;
}

// Ties at the threshold priority t of r[d] (r > t kept), taken in index order, or from the highest
// index down when `higher_first`, until `needed` are kept.
template <typename Key>
void top_tau_take_ties(const Key* r, Key t, int64_t d, int64_t needed, bool higher_first, bool* mask) {
  for (int64_t i = 0; i < d; ++i) {
    const int64_t j = higher_first ? d - 1 - i : i;
    const bool tie = r[j] == t && needed > 0;
    needed -= tie;
    mask[j] = r[j] > t || tie;
  }
}

// Fast path of top_tau_select for rows keeping only valid features (kk <= #valid): r = the rank
// priority for valid features, floored at 1, and 0 for invalid ones; the kk-th largest r is found
// by KthLargestSearch with vectorised counts (it usually stops after about log2(d) steps).
template <typename acc_t>
void top_tau_select_valid(const acc_t* score, const bool* valid, bool largest, bool higher_first, int64_t d,
                          int64_t kk, bool* mask, typename RankPriorityType<acc_t>::type* r) {
  using Key = typename RankPriorityType<acc_t>::type;
  for (int64_t j = 0; j < d; ++j) {
    const Key priority = rank_priority(score[j], largest);  // 0 only for NaN with largest=false
    r[j] = (valid == nullptr || valid[j]) ? std::max(priority, Key{1}) : Key{0};
  }
  KthLargestSearch<Key> search;
  while (search.running()) {
    const Key t = search.candidate();
    int32_t count = 0;
    for (int64_t j = 0; j < d; ++j) count += r[j] >= t;
    search.step(count, kk);
  }
  const Key threshold = search.threshold;
  if (search.exact) {
    for (int64_t j = 0; j < d; ++j) mask[j] = r[j] >= threshold;
    return;
  }
  int32_t above = 0;
  for (int64_t j = 0; j < d; ++j) above += r[j] > threshold;
  top_tau_take_ties(r, threshold, d, kk - above, higher_first, mask);
}

// mask[d] = the min(max(k, 0), d) features ranked first: valid before invalid, then by score
// (descending if largest, else ascending; NaN the largest), then by index (lower first, or higher
// first when `higher_first`).  Rows keeping only valid features take the search fast path;
// otherwise the k-th largest full key is found by nth_element.  O(d).
template <typename acc_t>
void top_tau_select(const TopTauProblem<acc_t>& pb, const acc_t* score, const bool* valid, int64_t k,
                    bool higher_first, bool* mask, TopTauWorkspace<acc_t>& ws) {
  const int64_t d = pb.d;
  const int64_t kk = clamp_count(k, d);
  if (kk == 0 || kk == d) {
    for (int64_t j = 0; j < d; ++j) mask[j] = kk == d;
    return;
  }
  const int64_t n_valid = valid == nullptr ? d : std::count(valid, valid + d, true);
  if (kk <= n_valid) return top_tau_select_valid(score, valid, pb.largest, higher_first, d, kk, mask, ws.ranks.data());
  auto key = [&](int64_t j) {
    return top_tau_key(score[j], valid == nullptr || valid[j], pb.largest, j, higher_first);
  };
  auto* keys = ws.keys.data();
  for (int64_t j = 0; j < d; ++j) keys[j] = key(j);
  std::nth_element(keys, keys + (kk - 1), keys + d, std::greater<>());
  const auto threshold = keys[kk - 1];
  for (int64_t j = 0; j < d; ++j) mask[j] = key(j) >= threshold;
}

// indices[k_max] (int64 or int32) = the positions of mask[d] in ascending order, -1 padded at the end;
// positions[d] is scratch (the loop stores every j and advances on kept ones: no branches).
template <typename index_t>
void top_tau_write_indices(const bool* mask, int64_t d, int64_t k_max, index_t* indices, int64_t* positions) {
  int64_t count = 0;
  for (int64_t j = 0; j < d; ++j) {
    positions[count] = j;
    count += mask[j];
  }
  count = std::min(count, k_max);
  std::copy(positions, positions + count, indices);
  std::fill(indices + count, indices + k_max, index_t{-1});
}

// One row of the forward: logits[d] (+ valid[d] or nullptr) and its count k ->
// indices[k_max], mask[d], lam (= 2 * sum_{mask} attention - 1), attention[d] (the row of
// ws.attention when the caller keeps none).  A row without a result (python/sopfast/ops/counts.py: NaN
// among its valid logits or none above -inf; with a blur any NaN or infinity) keeps no feature
// (indices -1, mask false) and gets NaN lam and attention.
template <typename scalar_t, typename acc_t, typename index_t>
void top_tau_forward_row(const TopTauProblem<acc_t>& pb, const scalar_t* logits, const bool* valid, int64_t k,
                         index_t* indices, bool* mask, acc_t* lam, acc_t* attention, TopTauWorkspace<acc_t>& ws) {
  bool finite = true;
  const acc_t* s = top_tau_blurred_logits(pb, logits, ws, finite);
  acc_t row_max = 0;
  if (!top_tau_softmax(s, valid, pb.d, attention, row_max) || !finite) {
    std::fill(indices, indices + pb.k_max, index_t{-1});
    std::fill(mask, mask + pb.d, false);
    *lam = std::numeric_limits<acc_t>::quiet_NaN();
    std::fill(attention, attention + pb.d, std::numeric_limits<acc_t>::quiet_NaN());
    return;
  }
  // the authors' rule ranks authors_score (ws.tmp is free after the blur), equal ones higher index first
  // when keeping the largest
  const acc_t* score = s;
  if (pb.ties_authors) {
    acc_t* scores = ws.tmp.data();
    for (int64_t j = 0; j < pb.d; ++j) scores[j] = authors_score(s[j], row_max);
    score = scores;
  }
  top_tau_select(pb, score, valid, k, pb.ties_authors && pb.largest, mask, ws);
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

// Rows [begin, end) of the forward over logits[N, d], valid[N, d] (or nullptr), k[N] (or nullptr:
// every row keeps k_max); attention[N, d] may be nullptr (not kept).
template <typename scalar_t, typename acc_t, typename index_t>
void top_tau_forward_rows(const TopTauProblem<acc_t>& pb, const scalar_t* logits, const bool* valid, const int64_t* k,
                          index_t* indices, bool* mask, acc_t* lam, acc_t* attention, int64_t begin, int64_t end) {
  TopTauWorkspace<acc_t> ws(pb.d, attention == nullptr);
  const int64_t d = pb.d;
  for (int64_t r = begin; r < end; ++r) {
    top_tau_forward_row(pb, logits + r * d, valid == nullptr ? nullptr : valid + r * d,
                        k == nullptr ? pb.k_max : k[r], indices + r * pb.k_max, mask + r * d, lam + r,
                        attention == nullptr ? ws.attention.data() : attention + r * d, ws);
  }
}

// Rows [begin, end) of the backward; grad_attention[N, d] may be nullptr.
template <typename acc_t>
void top_tau_backward_rows(const TopTauProblem<acc_t>& pb, const acc_t* attention, const bool* mask, const acc_t* lam,
                           const acc_t* grad_lam, const acc_t* grad_attention, acc_t* grad_logits, int64_t begin,
                           int64_t end) {
  TopTauWorkspace<acc_t> ws(pb.d, false);
  const int64_t d = pb.d;
  for (int64_t r = begin; r < end; ++r) {
    top_tau_backward_row(pb, attention + r * d, mask + r * d, lam[r], grad_lam[r],
                         grad_attention == nullptr ? nullptr : grad_attention + r * d, grad_logits + r * d, ws);
  }
}

}  // namespace sopfast::cpu
