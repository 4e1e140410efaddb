// The per-row algorithms of the CUDA kernels, written once against a "team" of threads that
// owns one row: nvcc compiles them into the kernels (csrc/cuda/*.cu, teams of csrc/cuda/teams.cuh:
// 4-8 lanes of a warp, a warp, or a block), g++ into csrc/tests, where a team of std::threads
// runs the same code (csrc/tests/host_team.h).  No torch, no CUDA headers.
//
// A Team provides, for its size() threads of rank() 0..size()-1, each call made by all of them:
//   sum(v), max(v)     the team-wide sum / maximum (max of values without NaN),
//   count(flag)        how many threads pass flag = true,
//   count_before(flag) how many threads of lower rank pass flag = true,
//   sync()             a barrier that also orders memory (for the row buffer).
// Thread `rank` holds the row's positions j = rank + size() * v, v < VPT, in registers: loads and
// stores are coalesced, and the index order is v-major, rank-minor.
#pragma once

#include <cstdint>

#include "sopfast_common.h"
#include "top_tau_row.h"

#if defined(__CUDACC__)
#define SOPFAST_TEAM_FN __device__ __forceinline__
#define SOPFAST_UNROLL _Pragma("unroll")  // keeps the per-thread arrays in registers
#else
#define SOPFAST_TEAM_FN inline
#define SOPFAST_UNROLL
#endif

namespace sopfast {

// ---- blur (reflect padding, torchvision semantics) ----

template <typename acc_t>
struct BlurSpec {
  const acc_t* kernel = nullptr;  // [size] or nullptr: no blur
  int64_t size = 0;
  int64_t grid_h = 0, grid_w = 0;  // both > 0: separable 2-D blur on [grid_h, grid_w]; else 1-D

  SOPFAST_HD bool on() const { return kernel != nullptr && size > 0; }
  SOPFAST_HD bool two_d() const { return grid_h > 0 && grid_w > 0; }
};

// sum_t kernel[t] * in(reflect(pos + t - pad)) along one axis of length len; in(q) loads position q.
template <typename acc_t, typename Load>
SOPFAST_TEAM_FN acc_t blur_at(const BlurSpec<acc_t>& blur, int64_t pos, int64_t len, Load in) {
  const int64_t pad = blur.size / 2;
  acc_t acc = 0;
  for (int64_t t = 0; t < blur.size; ++t) acc += mul_rn(blur.kernel[t], in(reflect_index(pos + t - pad, len)));
  return acc;
}

// Transpose of blur_at at position pos: sum of kernel[t] * g(j) over all (j, t) with
// reflect(j + t - pad) == pos, i.e. j + t - pad is pos or one of its reflected images.
template <typename acc_t, typename Load>
SOPFAST_TEAM_FN acc_t blur_adjoint_at(const BlurSpec<acc_t>& blur, int64_t pos, int64_t len, Load g) {
  const int64_t pad = blur.size / 2;
  const int64_t images[3] = {pos, -pos, 2 * (len - 1) - pos};
  const bool used[3] = {true, pos >= 1 && pos <= pad, pos <= len - 2 && pos >= len - 1 - pad};
  acc_t acc = 0;
  for (int m = 0; m < 3; ++m) {
    if (!used[m]) continue;
    for (int64_t t = 0; t < blur.size; ++t) {
      const int64_t j = images[m] - t + pad;
      if (j >= 0 && j < len) acc += mul_rn(blur.kernel[t], g(j));
    }
  }
  return acc;
}

// x[VPT] (this thread's positions of a row of d) <- blur(x), through buffer[d] (shared by the team).
// 2-D: along w, then along h (as the CPU kernels and the reference).
template <int VPT, typename acc_t, typename Team>
SOPFAST_TEAM_FN void team_blur(const Team& team, const BlurSpec<acc_t>& blur, int64_t d, acc_t* buffer,
                               acc_t (&x)[VPT]) {
  const int64_t size = team.size(), rank = team.rank();
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t j = rank + size * v;
    if (j < d) buffer[j] = x[v];
  }
  team.sync();
  if (blur.two_d()) {
    const int64_t h = blur.grid_h, w = blur.grid_w;
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) x[v] = blur_at(blur, j % w, w, [&](int64_t q) { return buffer[(j / w) * w + q]; });
    }
    team.sync();
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) buffer[j] = x[v];
    }
    team.sync();
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) x[v] = blur_at(blur, j / w, h, [&](int64_t q) { return buffer[q * w + j % w]; });
    }
  } else {
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) x[v] = blur_at(blur, j, d, [&](int64_t q) { return buffer[q]; });
    }
  }
  team.sync();  // the buffer is free again
}

// x[VPT] <- blur^T(x) through buffer[d]: 2-D along h first, then along w (the transpose's order).
template <int VPT, typename acc_t, typename Team>
SOPFAST_TEAM_FN void team_blur_adjoint(const Team& team, const BlurSpec<acc_t>& blur, int64_t d, acc_t* buffer,
                                       acc_t (&x)[VPT]) {
  const int64_t size = team.size(), rank = team.rank();
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t j = rank + size * v;
    if (j < d) buffer[j] = x[v];
  }
  team.sync();
  if (blur.two_d()) {
    const int64_t h = blur.grid_h, w = blur.grid_w;
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) x[v] = blur_adjoint_at(blur, j / w, h, [&](int64_t q) { return buffer[q * w + j % w]; });
    }
    team.sync();
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) buffer[j] = x[v];
    }
    team.sync();
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) x[v] = blur_adjoint_at(blur, j % w, w, [&](int64_t q) { return buffer[(j / w) * w + q]; });
    }
  } else {
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t j = rank + size * v;
      if (j < d) x[v] = blur_adjoint_at(blur, j, d, [&](int64_t q) { return buffer[q]; });
    }
  }
  team.sync();
}

// ---- top_tau ----

// One row of top_tau: its problem and its outputs.
template <typename acc_t>
struct TopTauRow {
  int64_t d = 0, k = 0, k_max = 0;
  bool largest = true;
  bool ties_authors = false;  // rank the attention (equal: higher index first if largest), else the logits
  BlurSpec<acc_t> blur;
  acc_t* buffer = nullptr;  // [d], shared by the team: needed with a blur
  int64_t* indices = nullptr;  // [k_max] out
  bool* mask = nullptr;        // [d] out
  acc_t* lam = nullptr;        // [1] out
  acc_t* attention = nullptr;  // [d] out
};

// The forward of one row by a team, one pass over memory: logit(j) and valid(j) load position j.
// Blur -> softmax over the valid features (+inf entries share the mass; NaN, or no finite valid
// entry: NaN) -> the k valid features ranked first by rank_priority of the score (the attention for
// the authors' rule, else the blurred logits), found by KthLargestSearch on team counts (early
// exit), ties at the threshold by index through team prefix counts -> mask, attention, lam and the
// ascending indices compacted by prefix counts.  k is clamped to [0, #valid].  VPT <= 32.
template <int VPT, typename acc_t, typename Team, typename LoadLogit, typename LoadValid>
SOPFAST_TEAM_FN void top_tau_team_row(const Team& team, const TopTauRow<acc_t>& row, LoadLogit logit,
                                      LoadValid valid) {
  static_assert(VPT >= 1 && VPT <= 32, "VPT must lie in [1, 32]");
  using Key = typename RankPriorityType<acc_t>::type;
  const acc_t inf = positive_infinity<acc_t>();
  const int64_t size = team.size(), rank = team.rank(), d = row.d;
  acc_t s[VPT];
  uint32_t eligible = 0;  // bit v: position rank + size * v is in the row and valid
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t j = rank + size * v;
    s[v] = j < d ? logit(j) : acc_t(0);
    eligible |= (j < d && valid(j)) ? (1u << v) : 0u;
  }
  if (row.blur.on()) team_blur<VPT>(team, row.blur, d, row.buffer, s);
  auto ok = [eligible](int v) { return ((eligible >> v) & 1u) != 0; };

  // softmax over the eligible positions
  acc_t row_max = -inf;
  int n_posinf = 0, n_nan = 0, n_eligible = 0;
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    if (!ok(v)) continue;
    row_max = s[v] > row_max ? s[v] : row_max;  // NaN never compares greater
    n_posinf += s[v] == inf;
    n_nan += s[v] != s[v];
    ++n_eligible;
  }
  row_max = team.max(row_max);
  n_posinf = team.sum(n_posinf);
  n_nan = team.sum(n_nan);
  n_eligible = team.sum(n_eligible);
  const bool undefined = n_posinf == 0 && (n_nan > 0 || row_max == -inf);
  acc_t total = 0;
  if (n_posinf == 0 && !undefined) {
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) total += (ok(v) && s[v] == s[v]) ? softmax_exp(s[v] - row_max) : acc_t(0);
  }
  const acc_t inv_total = acc_t(1) / team.sum(total);
  acc_t a[VPT];
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    if (n_posinf > 0) {
      a[v] = (ok(v) && s[v] == inf) ? acc_t(1) / acc_t(n_posinf) : acc_t(0);
    } else if (undefined) {
      a[v] = quiet_nan<acc_t>();
    } else {
      a[v] = (ok(v) && s[v] == s[v]) ? softmax_exp(s[v] - row_max) * inv_total : acc_t(0);
    }
  }

  // the threshold priority of the k-th ranked eligible feature
  auto key = [&](int v) { return rank_priority(row.ties_authors ? a[v] : s[v], row.largest); };
  const int64_t kk = clamp_count(row.k, n_eligible);
  Key threshold = ~Key(0);
  int64_t needed = 0;
  int n_tied = 0;
  if (kk > 0) {
    KthLargestSearch<Key> search;
    search.exact = kk == n_eligible;  // threshold 0: every eligible feature
    while (search.running()) {
      const Key candidate = search.candidate();
      int count = 0;
      SOPFAST_UNROLL
      for (int v = 0; v < VPT; ++v) count += ok(v) && key(v) >= candidate;
      search.step(team.sum(count), kk);
    }
    threshold = search.threshold;
    int above = 0, tied = 0;
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      above += ok(v) && key(v) > threshold;
      tied += ok(v) && key(v) == threshold;
    }
    needed = kk - team.sum(above);
    n_tied = team.sum(tied);
  }

  // selection in index order: ties by prefix counts, indices compacted by prefix counts
  const bool higher_first = row.ties_authors && row.largest;
  int tied_before = 0, selected_before = 0;
  acc_t kept = 0;
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t j = rank + size * v;
    const bool candidate = kk > 0 && ok(v);
    const Key kv = key(v);
    const bool tied = candidate && kv == threshold;
    const int through = tied_before + team.count_before(tied) + (tied ? 1 : 0);
    const int tie_rank = higher_first ? n_tied - through + (tied ? 1 : 0) : through;
    const bool selected = candidate && (kv > threshold || (tied && tie_rank <= needed));
    tied_before += team.count(tied);
    if (j < d) {
      row.mask[j] = selected;
      row.attention[j] = a[v];
    }
    kept += selected ? a[v] : acc_t(0);
    const int position = selected_before + team.count_before(selected);
    if (selected && position < row.k_max) row.indices[position] = j;
    selected_before += team.count(selected);
  }
  kept = team.sum(kept);
  if (rank == 0) *row.lam = 2 * kept - 1;
  for (int64_t position = selected_before + rank; position < row.k_max; position += size) row.indices[position] = -1;
}

// One row of the top_tau backward: grad_logits = blur^T(a * (grad_lam * (sigma - lam) + (ga - <a, ga>)))
// with sigma = +1 in the mask, -1 outside; load_ga(j) is only called when has_grad_attention.
template <int VPT, typename acc_t, typename Team, typename LoadA, typename LoadMask, typename LoadGa, typename Store>
SOPFAST_TEAM_FN void top_tau_backward_team_row(const Team& team, int64_t d, acc_t lam, acc_t grad_lam,
                                               bool has_grad_attention, const BlurSpec<acc_t>& blur, acc_t* buffer,
                                               LoadA load_a, LoadMask load_mask, LoadGa load_ga, Store store) {
  const int64_t size = team.size(), rank = team.rank();
  acc_t a[VPT], g[VPT];
  acc_t dot = 0;
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t j = rank + size * v;
    a[v] = j < d ? load_a(j) : acc_t(0);
    g[v] = (j < d && has_grad_attention) ? load_ga(j) : acc_t(0);
    dot += a[v] * g[v];
  }
  if (has_grad_attention) dot = team.sum(dot);
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t j = rank + size * v;
    const acc_t sign = (j < d && load_mask(j)) ? acc_t(1) : acc_t(-1);
    acc_t value = a[v] * (grad_lam * (sign - lam));
    if (has_grad_attention) value += a[v] * (g[v] - dot);
    g[v] = value;
  }
  if (blur.on()) team_blur_adjoint<VPT>(team, blur, d, buffer, g);
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t j = rank + size * v;
    if (j < d) store(j, g[v]);
  }
}

// ---- sparsemax ----

// One row of sparsemax by a team, the row in registers (n <= size * VPT): +inf entries take the
// mass (even beside NaN); NaN or all -inf rows give NaN; else Michelot's exact iteration
// tau <- (sum_{z > tau} z - 1) / #{z > tau} from tau = -1 on z = x - max, until the support stops
// shrinking (tau never decreases, so it ends).  store(i, p_i) for i < n.
template <int VPT, typename acc_t, typename Team, typename Load, typename Store>
SOPFAST_TEAM_FN void sparsemax_team_row(const Team& team, int64_t n, Load load, Store store) {
  const acc_t inf = positive_infinity<acc_t>();
  const int64_t size = team.size(), rank = team.rank();
  acc_t z[VPT];
  acc_t row_max = -inf;
  int n_posinf = 0, n_nan = 0;
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t i = rank + size * v;
    z[v] = i < n ? load(i) : -inf;
    row_max = z[v] > row_max ? z[v] : row_max;
    n_posinf += z[v] == inf;
    n_nan += z[v] != z[v];
  }
  row_max = team.max(row_max);
  n_posinf = team.sum(n_posinf);
  n_nan = team.sum(n_nan);
  if (n_posinf > 0 || n_nan > 0 || row_max == -inf) {
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t i = rank + size * v;
      if (i >= n) continue;
      store(i, n_posinf > 0 ? (z[v] == inf ? acc_t(1) / acc_t(n_posinf) : acc_t(0)) : quiet_nan<acc_t>());
    }
    return;
  }
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) z[v] -= row_max;
  acc_t tau = -1;
  int support = -1;
  while (true) {
    acc_t sum = 0;
    int count = 0;
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      sum += z[v] > tau ? z[v] : acc_t(0);
      count += z[v] > tau;
    }
    sum = team.sum(sum);
    count = team.sum(count);
    if (count == support) break;
    support = count;
    const acc_t next = (sum - acc_t(1)) / acc_t(count);
    tau = next > tau ? next : tau;
  }
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int64_t i = rank + size * v;
    if (i < n) store(i, z[v] > tau ? z[v] - tau : acc_t(0));
  }
}

// One row of the sparsemax backward by a team: (g - mean_S g) on S = {p > 0}, 0 elsewhere.
template <typename acc_t, typename Team, typename LoadP, typename LoadG, typename Store>
SOPFAST_TEAM_FN void sparsemax_backward_team_row(const Team& team, int64_t n, LoadP load_p, LoadG load_g,
                                                 Store store) {
  acc_t sum = 0;
  int support = 0;
  for (int64_t i = team.rank(); i < n; i += team.size()) {
    const bool in_support = load_p(i) > acc_t(0);
    sum += in_support ? load_g(i) : acc_t(0);
    support += in_support;
  }
  sum = team.sum(sum);
  support = team.sum(support);
  const acc_t mean = sum / acc_t(support > 0 ? support : 1);
  for (int64_t i = team.rank(); i < n; i += team.size()) store(i, load_p(i) > acc_t(0) ? load_g(i) - mean : acc_t(0));
}

// ---- gather_tokens backward: the inverted index (CSR) ----
//
// Per batch element b, the body entries (group i, slot s) that read token t (padding and
// out-of-range indices excluded) form the segment entries[offsets[b, t] .. offsets[b, t + 1]) of
// entry numbers e = i * keep + s, in increasing e (a stable counting sort).  offsets [B, T + 1] are
// absolute positions in entries [B * groups * keep]; batch b's segments start at b * groups * keep.

// Columns c0 + c * stride, c < width, of grad_x[b, t] into accumulators acc[width]: the prefix
// slot t of every group when t < prefix, then the entries of (b, t) in their stable order.  Reads
// each gradient row of a body entry exactly once over all tokens.  load(row, c) reads grad[row, c]
// of the flattened grad [B * groups * (prefix + keep), E].
template <typename acc_t, typename Load>
SOPFAST_TEAM_FN void gather_tokens_backward_token(const GatherTokensShape& sh, const int64_t* offsets,
                                                  const int64_t* entries, int64_t b, int64_t t, int64_t c0,
                                                  int64_t width, int64_t stride, Load load, acc_t* acc) {
  for (int64_t c = 0; c < width; ++c) acc[c] = 0;
  const int64_t slots = sh.slots();
  if (t < sh.prefix) {
    for (int64_t i = 0; i < sh.groups; ++i) {
      const int64_t grad_row = (b * sh.groups + i) * slots + t;
      for (int64_t c = 0; c < width; ++c) acc[c] += load(grad_row, c0 + c * stride);
    }
  }
  const int64_t segment = b * (sh.tokens + 1) + t;
  for (int64_t e = offsets[segment]; e < offsets[segment + 1]; ++e) {
    const int64_t local = entries[e];  // i * keep + s
    const int64_t grad_row = (b * sh.groups + local / sh.keep) * slots + sh.prefix + local % sh.keep;
    for (int64_t c = 0; c < width; ++c) acc[c] += load(grad_row, c0 + c * stride);
  }
}

// The CSR of batch element b built sequentially (the contract the parallel CUDA build meets; used by
// the host tests): counts[T] is scratch.
SOPFAST_HD void gather_tokens_csr_build(const GatherTokensShape& sh, const int64_t* indices, int64_t b,
                                        int64_t* offsets, int64_t* entries, int64_t* counts) {
  const int64_t body = sh.groups * sh.keep;
  for (int64_t t = 0; t < sh.tokens; ++t) counts[t] = 0;
  for (int64_t e = 0; e < body; ++e) {
    const int64_t token = indices[b * body + e];
    if (token >= 0 && token < sh.tokens) ++counts[token];
  }
  int64_t* segment = offsets + b * (sh.tokens + 1);
  segment[0] = b * body;
  for (int64_t t = 0; t < sh.tokens; ++t) segment[t + 1] = segment[t] + counts[t];
  for (int64_t t = 0; t < sh.tokens; ++t) counts[t] = segment[t];
  for (int64_t e = 0; e < body; ++e) {
    const int64_t token = indices[b * body + e];
    if (token >= 0 && token < sh.tokens) entries[counts[token]++] = e;
  }
}

}  // namespace sopfast
