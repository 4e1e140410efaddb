// The per-row algorithms of the CUDA kernels, written once against a "team" of threads that
// owns one row: nvcc compiles them into the kernels (csrc/cuda/*.cu, teams of csrc/cuda/teams.cuh:
// 4-8 lanes of a warp, a warp, or a block), g++ into csrc/tests, where a team of std::threads
// runs the same code (csrc/tests/host_team.h).  No torch, no CUDA headers.
//
// A Team provides, for its size() threads of rank() 0..size()-1 in groups of lanes() <= 32
// threads (a warp; the whole team when it is part of a warp), this thread's group() and lane(),
// and these calls, each made by all of them:
//   sum(v), max(v)          the team-wide sum / maximum (max of values without NaN),
//   ballot(flag)            bit l set when lane l of this thread's group passes flag = true,
//   groups_before(c, &all)  c the same on every lane of a group: the sum of c over the lower groups
//                           (and in `all` over every group) -- one scan per call, whatever the row,
//   sync()                  a barrier that also orders memory (for the row buffer).
// sparsemax and the top_tau backward: thread (group g, lane l) holds the positions (g * vpt + v) *
// lanes() + l, v < vpt = ceil(d / size()) <= VPT, in registers (slot_position): loads and stores are
// coalesced.  The top_tau forward holds runs of kRun consecutive positions instead (run_position),
// so that a thread loads and stores each run with one vector access; a prefix count in index order
// is then kRun ballots within the group per run plus one scan over the groups.
#pragma once

#include <cstdint>

#include "sopfast_common.h"
#include "top_tau_row.h"

#if defined(__CUDACC__)
#define SOPFAST_TEAM_FN __device__ __forceinline__
#define SOPFAST_UNROLL _Pragma("unroll")       // keeps the per-thread arrays in registers
#define SOPFAST_NO_UNROLL _Pragma("unroll 1")  // loops of runtime length that need no registers
#else
#define SOPFAST_TEAM_FN inline
#define SOPFAST_UNROLL
#define SOPFAST_NO_UNROLL
#endif

namespace sopfast {

SOPFAST_HD int popcount(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __popc(bits);
#else
  return __builtin_popcount(bits);
#endif
}

// Values per thread that hold a row of d (at most the VPT of the registers).
template <typename Team>
SOPFAST_TEAM_FN int values_per_thread(const Team& team, int d) {
  return (d + team.size() - 1) / team.size();
}

// The row position of this thread's slot v (see the layout above).
template <typename Team>
SOPFAST_TEAM_FN int slot_position(const Team& team, int vpt, int v) {
  return (team.group() * vpt + v) * team.lanes() + team.lane();
}

// Positions per run of the top_tau forward's layout.
constexpr int kRun = 4;

// Values per thread of the run layout: whole runs (a multiple of kRun).
template <typename Team>
SOPFAST_TEAM_FN int run_values_per_thread(const Team& team, int d) {
  const int runs = (d + kRun - 1) / kRun;
  return (runs + team.size() - 1) / team.size() * kRun;
}

// The row position of this thread's slot v in the run layout: run q = v / kRun of the thread,
// lane-major within its group, then c = v % kRun within the run.
template <typename Team>
SOPFAST_TEAM_FN int run_position(const Team& team, int vpt, int v) {
  return ((team.group() * (vpt / kRun) + v / kRun) * team.lanes() + team.lane()) * kRun + v % kRun;
}

// ---- blur (reflect padding, torchvision semantics) ----

template <typename acc_t>
struct BlurSpec {
  const acc_t* kernel = nullptr;  // [size]
  int size = 0;
  int grid_h = 0, grid_w = 0;  // both > 0: separable 2-D blur on [grid_h, grid_w]; else 1-D

  SOPFAST_HD bool two_d() const { return grid_h > 0 && grid_w > 0; }
};

// sum_t kernel[t] * in(reflect(pos + t - pad)) along one axis of length len; in(q) loads position q.
template <typename acc_t, typename Load>
SOPFAST_TEAM_FN acc_t blur_at(const BlurSpec<acc_t>& blur, int pos, int len, Load in) {
  const int pad = blur.size / 2;
  acc_t acc = 0;
  SOPFAST_NO_UNROLL
  for (int t = 0; t < blur.size; ++t) acc += mul_rn(blur.kernel[t], in(reflect_index(pos + t - pad, len)));
  return acc;
}

// Transpose of blur_at at position pos: sum of kernel[t] * g(j) over all (j, t) with
// reflect(j + t - pad) == pos, i.e. j + t - pad is pos or one of its reflected images.
template <typename acc_t, typename Load>
SOPFAST_TEAM_FN acc_t blur_adjoint_at(const BlurSpec<acc_t>& blur, int pos, int len, Load g) {
  const int pad = blur.size / 2;
  acc_t acc = 0;
  SOPFAST_NO_UNROLL
  for (int m = 0; m < 3; ++m) {
    const int image = m == 0 ? pos : (m == 1 ? -pos : 2 * (len - 1) - pos);
    const bool used = m == 0 || (m == 1 ? pos >= 1 && pos <= pad : pos <= len - 2 && pos >= len - 1 - pad);
    if (!used) continue;
    SOPFAST_NO_UNROLL
    for (int t = 0; t < blur.size; ++t) {
      const int j = image - t + pad;
      if (j >= 0 && j < len) acc += mul_rn(blur.kernel[t], g(j));
    }
  }
  return acc;
}

// The layouts, as the position of slot v: slot_position, or run_position (RUNS).
template <bool RUNS, typename Team>
SOPFAST_TEAM_FN int layout_position(const Team& team, int vpt, int v) {
  if constexpr (RUNS) {
    return run_position(team, vpt, v);
  } else {
    return slot_position(team, vpt, v);
  }
}

// buffer[j] <- x[v] for this thread's positions j < d, then a barrier.
template <int VPT, bool RUNS, typename acc_t, typename Team>
SOPFAST_TEAM_FN void team_stage(const Team& team, int d, int vpt, acc_t* buffer, const acc_t (&x)[VPT]) {
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int j = layout_position<RUNS>(team, vpt, v);
    if (v < vpt && j < d) buffer[j] = x[v];
  }
  team.sync();
}

// x[v] <- buffer[j] for this thread's positions j < d, then a barrier: the buffer is free again.
template <int VPT, bool RUNS, typename acc_t, typename Team>
SOPFAST_TEAM_FN void team_load(const Team& team, int d, int vpt, const acc_t* buffer, acc_t (&x)[VPT]) {
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int j = layout_position<RUNS>(team, vpt, v);
    if (v < vpt && j < d) x[v] = buffer[j];
  }
  team.sync();
}

// out[j] <- at(j) for every j < d, the team's threads taking every size()-th position, then a
// barrier.  A loop, not unrolled: the blur's taps need no registers per position.
template <typename acc_t, typename Team, typename At>
SOPFAST_TEAM_FN void team_fill(const Team& team, int d, acc_t* out, At at) {
  SOPFAST_NO_UNROLL
  for (int j = team.rank(); j < d; j += team.size()) out[j] = at(j);
  team.sync();
}

// x[VPT] (this thread's positions of a row of d, in the layout RUNS) <- blur(x), through buffer[d]
// and spare[d] (each shared by the team; spare may be an output row written afterwards).  2-D: along
// w, then along h (as the CPU kernels and the reference).
template <int VPT, bool RUNS, typename acc_t, typename Team>
SOPFAST_TEAM_FN void team_blur(const Team& team, const BlurSpec<acc_t>& blur, int d, int vpt, acc_t* buffer,
                               acc_t* spare, acc_t (&x)[VPT]) {
  team_stage<VPT, RUNS>(team, d, vpt, buffer, x);
  if (!blur.two_d()) {
    team_fill(team, d, spare, [&](int j) { return blur_at(blur, j, d, [&](int q) { return buffer[q]; }); });
    team_load<VPT, RUNS>(team, d, vpt, spare, x);
    return;
  }
  const int h = blur.grid_h, w = blur.grid_w;
  team_fill(team, d, spare, [&](int j) {
    const acc_t* line = buffer + (j / w) * w;
    return blur_at(blur, j % w, w, [&](int q) { return line[q]; });
  });
  team_fill(team, d, buffer, [&](int j) {
    const acc_t* column = spare + j % w;
    return blur_at(blur, j / w, h, [&](int q) { return column[q * w]; });
  });
  team_load<VPT, RUNS>(team, d, vpt, buffer, x);
}

// x[VPT] <- blur^T(x) through buffer[d] and spare[d]: 2-D along h first, then along w (the
// transpose's order).
template <int VPT, typename acc_t, typename Team>
SOPFAST_TEAM_FN void team_blur_adjoint(const Team& team, const BlurSpec<acc_t>& blur, int d, int vpt, acc_t* buffer,
                                       acc_t* spare, acc_t (&x)[VPT]) {
  team_stage<VPT, false>(team, d, vpt, buffer, x);
  if (!blur.two_d()) {
    team_fill(team, d, spare, [&](int j) { return blur_adjoint_at(blur, j, d, [&](int q) { return buffer[q]; }); });
    team_load<VPT, false>(team, d, vpt, spare, x);
    return;
  }
  const int h = blur.grid_h, w = blur.grid_w;
  team_fill(team, d, spare, [&](int j) {
    const acc_t* column = buffer + j % w;
    return blur_adjoint_at(blur, j / w, h, [&](int q) { return column[q * w]; });
  });
  team_fill(team, d, buffer, [&](int j) {
    const acc_t* line = spare + (j / w) * w;
    return blur_adjoint_at(blur, j % w, w, [&](int q) { return line[q]; });
  });
  team_load<VPT, false>(team, d, vpt, buffer, x);
}

// ---- top_tau ----

// One row of top_tau: its problem and its outputs.
template <typename acc_t>
struct TopTauRow {
  int d = 0;
  int64_t k = 0, k_max = 0;
  bool largest = true;
  bool ties_authors = false;  // rank authors_score (equal: higher index first if largest), else the logits
  BlurSpec<acc_t> blur;       // used when the kernel blurs (BLUR)
  acc_t* buffer = nullptr;    // [d], shared by the team: needed with a blur
  int64_t* indices = nullptr;  // [k_max] out (or indices32)
  int32_t* indices32 = nullptr;
  bool* mask = nullptr;        // [d] out
  acc_t* lam = nullptr;        // [1] out
  acc_t* attention = nullptr;  // [d] out, or nullptr (not written); needed with a blur (the spare row)
};

// n <= kRun values from p[0..n) into out[0..n): one vector access for a whole aligned run.  Every loop
// over a run has kRun trips (unrolled, positions c >= n skipped): a runtime trip count would index the
// caller's register arrays at run time and put them in local memory (bench/kernel_budgets.py counts it).
template <typename T>
struct alignas(kRun * sizeof(T)) RunOf {
  T v[kRun];
};
template <typename T, typename U>
SOPFAST_TEAM_FN void load_run(const T* p, int n, U* out) {
  if (n == kRun && reinterpret_cast<uintptr_t>(p) % sizeof(RunOf<T>) == 0) {
    const RunOf<T> run = *reinterpret_cast<const RunOf<T>*>(p);
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) out[c] = static_cast<U>(run.v[c]);
    return;
  }
  SOPFAST_UNROLL
  for (int c = 0; c < kRun; ++c) {
    if (c < n) out[c] = static_cast<U>(p[c]);
  }
}
template <typename T>
SOPFAST_TEAM_FN void store_run(T* p, int n, const T* values) {
  if (n == kRun && reinterpret_cast<uintptr_t>(p) % sizeof(RunOf<T>) == 0) {
    RunOf<T> run;
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) run.v[c] = values[c];
    *reinterpret_cast<RunOf<T>*>(p) = run;
    return;
  }
  SOPFAST_UNROLL
  for (int c = 0; c < kRun; ++c) {
    if (c < n) p[c] = values[c];
  }
}

// A run loader from a per-position one (the host tests): load(j0, n, out) sets out[c] = at(j0 + c).
template <typename At>
SOPFAST_TEAM_FN auto per_position(At at) {
  return [at](int j0, int n, auto* out) {
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) {
      if (c < n) out[c] = at(j0 + c);
    }
  };
}

// The forward of one row by a team, one pass over memory, in the run layout (run_position): the
// team loads each run of kRun features with load_logits(j0, n, acc_t* out) and load_valid(j0, n,
// bool* out) (one vector access each in the kernels).  Blur (when BLUR; through row.buffer and the
// attention row) -> softmax over the valid features (+inf entries share the mass), written out when
// row.attention is set -> the k valid features ranked first by rank_priority of the score
// (authors_score for the authors' rule, else the blurred logit), found by RadixSearch on team counts
// (several bits per count, early exit) -> the selection in index order: the features ranked above
// the threshold and the first `needed` tied ones (the last ones when ties go to the higher index),
// placed by two prefix counts (kRun ballots per run within a group, one scan over the groups) ->
// mask, lam and the ascending indices.  A row without a result (a NaN among the valid logits, none
// above -inf; with a blur any NaN or infinity) keeps no feature: NaN lam and attention, mask false,
// indices -1.  One value per position in registers after the softmax, the key of its score: the
// attention is recomputed from it where it is summed (authors_score's -inf gives 0, as the softmax).  k is clamped to
// [0, #valid].  d <= size() * VPT, VPT a multiple of kRun, at most 32.
template <int VPT, bool BLUR, typename acc_t, typename Team, typename LoadLogits, typename LoadValid>
SOPFAST_TEAM_FN void top_tau_team_row(const Team& team, const TopTauRow<acc_t>& row, LoadLogits load_logits,
                                      LoadValid load_valid) {
  static_assert(VPT >= kRun && VPT <= 32 && VPT % kRun == 0, "VPT must be a multiple of kRun in [kRun, 32]");
  using Key = typename RankPriorityType<acc_t>::type;
  const acc_t inf = positive_infinity<acc_t>();
  const int d = row.d, vpt = run_values_per_thread(team, d);
  acc_t s[VPT];
  uint32_t eligible = 0, in_row = 0;  // bit v: slot v is in the row (and valid)
  SOPFAST_UNROLL
  for (int q = 0; q < VPT / kRun; ++q) {
    const int j0 = run_position(team, vpt, q * kRun);
    const int n = q * kRun < vpt && j0 < d ? (d - j0 < kRun ? d - j0 : kRun) : 0;
    bool valid[kRun] = {};
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) s[q * kRun + c] = acc_t(0);
    if (n > 0) {
      load_logits(j0, n, &s[q * kRun]);
      load_valid(j0, n, valid);
    }
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) {
      in_row |= c < n ? (1u << (q * kRun + c)) : 0u;
      eligible |= (c < n && valid[c]) ? (1u << (q * kRun + c)) : 0u;
    }
  }
  auto present = [in_row](int v) { return ((in_row >> v) & 1u) != 0; };
  auto ok = [eligible](int v) { return ((eligible >> v) & 1u) != 0; };
  bool raw_finite = true;
  if constexpr (BLUR) {  // a blur mixes each logit with its neighbours: any NaN or infinity leaves no result
    int bad = 0;
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) bad += present(v) && !(s[v] - s[v] == acc_t(0));
    raw_finite = team.sum(bad) == 0;
    team_blur<VPT, true>(team, row.blur, d, vpt, row.buffer, row.attention, s);
  }

  // softmax over the eligible positions; the three counts in one team sum (each at most d < 2^20)
  acc_t row_max = -inf;
  uint64_t counts = 0;
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    if (!ok(v)) continue;
    row_max = s[v] > row_max ? s[v] : row_max;  // NaN never compares greater
    counts += static_cast<uint64_t>(s[v] == inf) | (static_cast<uint64_t>(s[v] != s[v]) << 20) | (uint64_t{1} << 40);
  }
  row_max = team.max(row_max);
  counts = team.sum(counts);
  const int n_posinf = static_cast<int>(counts & 0xFFFFF), n_nan = static_cast<int>((counts >> 20) & 0xFFFFF);
  const int n_eligible = static_cast<int>(counts >> 40);
  if (!raw_finite || n_nan > 0 || row_max == -inf) {
    SOPFAST_UNROLL
    for (int q = 0; q < VPT / kRun; ++q) {
      const int j0 = run_position(team, vpt, q * kRun);
      if (q * kRun >= vpt || j0 >= d) continue;
      const int n = d - j0 < kRun ? d - j0 : kRun;
      const bool none[kRun] = {};
      store_run(row.mask + j0, n, none);
      if (row.attention != nullptr) {
        acc_t nan[kRun];
        SOPFAST_UNROLL
        for (int c = 0; c < kRun; ++c) nan[c] = quiet_nan<acc_t>();
        store_run(row.attention + j0, n, nan);
      }
    }
    if (team.rank() == 0) *row.lam = quiet_nan<acc_t>();
    for (int64_t position = team.rank(); position < row.k_max; position += team.size()) {
      if (row.indices32 != nullptr) {
        row.indices32[position] = -1;
      } else {
        row.indices[position] = -1;
      }
    }
    return;
  }
  acc_t total = 0;
  if (n_posinf == 0) {
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) total += ok(v) ? softmax_exp(s[v] - row_max) : acc_t(0);
  }
  const acc_t inv_total = acc_t(1) / team.sum(total);
  auto attention = [&](acc_t x, bool eligible_x) {  // of a (blurred) logit
    if (n_posinf > 0) return (eligible_x && x == inf) ? acc_t(1) / acc_t(n_posinf) : acc_t(0);
    return eligible_x ? softmax_exp(x - row_max) * inv_total : acc_t(0);
  };
  // from here on the row is held as the keys of its scores (a score comes back from its key)
  Key keys[VPT];
  SOPFAST_UNROLL
  for (int q = 0; q < VPT / kRun; ++q) {
    acc_t a[kRun];
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) {
      const int v = q * kRun + c;
      a[c] = attention(s[v], ok(v));
      keys[v] = rank_priority(row.ties_authors ? authors_score(s[v], row_max) : s[v], row.largest);
    }
    const int j0 = run_position(team, vpt, q * kRun);
    if (row.attention != nullptr && q * kRun < vpt && j0 < d) store_run(row.attention + j0, d - j0 < kRun ? d - j0 : kRun, a);
  }

  // the threshold priority of the k-th ranked eligible feature
  const int kk = static_cast<int>(clamp_count(row.k, n_eligible));
  Key threshold = ~Key(0);
  if (kk > 0) {
    RadixSearch<Key> search(n_eligible);
    search.exact = kk == n_eligible;  // threshold 0: every eligible feature
    while (search.running()) {  // sass-loop: top_tau_search
      uint64_t packed = 0;
      SOPFAST_UNROLL
      for (int v = 0; v < VPT; ++v) packed += ok(v) ? search.share(keys[v]) : uint64_t{0};
      search.step(team.sum(packed), kk);
    }
    threshold = search.threshold;
  }
  auto above = [&](int v) { return kk > 0 && ok(v) && keys[v] > threshold; };
  auto tied = [&](int v) { return kk > 0 && ok(v) && keys[v] == threshold; };

  // how many of each precede this thread's group, and in the row
  int group_above = 0, group_tied = 0;
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    if (v >= vpt) break;
    group_above += popcount(team.ballot(above(v)));
    group_tied += popcount(team.ballot(tied(v)));
  }
  int n_above = 0, n_tied = 0;
  int above_before = team.groups_before(group_above, &n_above);
  int tied_before = team.groups_before(group_tied, &n_tied);
  const int needed = kk - n_above;      // tied features selected
  const int skipped = n_tied - needed;  // tied features left out
  const bool higher_first = row.ties_authors && row.largest;
  const uint32_t lower_lanes = (1u << team.lane()) - 1u;
  acc_t kept = 0;
  SOPFAST_UNROLL
  for (int q = 0; q < VPT / kRun; ++q) {
    if (q * kRun >= vpt) break;
    uint32_t above_bits[kRun], tied_bits[kRun];
    int above_lower = 0, tied_lower = 0;  // in this run, on the lower lanes of the group
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) {
      above_bits[c] = team.ballot(above(q * kRun + c));
      tied_bits[c] = team.ballot(tied(q * kRun + c));
      above_lower += popcount(above_bits[c] & lower_lanes);
      tied_lower += popcount(tied_bits[c] & lower_lanes);
    }
    const int j0 = run_position(team, vpt, q * kRun);
    bool selected_run[kRun];
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) {
      const int v = q * kRun + c, j = j0 + c;
      const bool is_above = above(v), is_tied = tied(v);
      const int above_rank = above_before + above_lower;  // above features before j
      const int tied_rank = tied_before + tied_lower;     // tied features before j
      const bool selected = is_above || (is_tied && (higher_first ? tied_rank >= skipped : tied_rank < needed));
      selected_run[c] = selected;
      if (selected) kept += attention(score_from_priority(keys[v], row.largest), true);
      const int tied_selected_before = higher_first ? (tied_rank > skipped ? tied_rank - skipped : 0)
                                                    : (tied_rank < needed ? tied_rank : needed);
      const int position = above_rank + tied_selected_before;
      if (selected && position < row.k_max) {
        if (row.indices32 != nullptr) {
          row.indices32[position] = j;
        } else {
          row.indices[position] = j;
        }
      }
      above_lower += is_above;
      tied_lower += is_tied;
    }
    if (j0 < d) store_run(row.mask + j0, d - j0 < kRun ? d - j0 : kRun, selected_run);
    SOPFAST_UNROLL
    for (int c = 0; c < kRun; ++c) {
      above_before += popcount(above_bits[c]);
      tied_before += popcount(tied_bits[c]);
    }
  }
  kept = team.sum(kept);
  if (team.rank() == 0) *row.lam = 2 * kept - 1;
  for (int64_t position = kk + team.rank(); position < row.k_max; position += team.size()) {
    if (row.indices32 != nullptr) {
      row.indices32[position] = -1;
    } else {
      row.indices[position] = -1;
    }
  }
}

// One row of the top_tau backward: grad_logits = blur^T(a * (grad_lam * (sigma - lam) + (ga - <a, ga>)))
// with sigma = +1 in the mask, -1 outside (blur^T when BLUR, through buffer and spare, e.g. the
// output row); load_ga(j) is only called when has_grad_attention.
template <int VPT, bool BLUR, typename acc_t, typename Team, typename LoadA, typename LoadMask, typename LoadGa,
          typename Store>
SOPFAST_TEAM_FN void top_tau_backward_team_row(const Team& team, int d, acc_t lam, acc_t grad_lam,
                                               bool has_grad_attention, const BlurSpec<acc_t>& blur, acc_t* buffer,
                                               acc_t* spare, LoadA load_a, LoadMask load_mask, LoadGa load_ga,
                                               Store store) {
  const int vpt = values_per_thread(team, d);
  auto in_row = [&](int v, int j) { return v < vpt && j < d; };
  acc_t dot = 0;
  if (has_grad_attention) {
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int j = slot_position(team, vpt, v);
      if (in_row(v, j)) dot += load_a(j) * load_ga(j);
    }
    dot = team.sum(dot);
  }
  acc_t g[VPT];
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int j = slot_position(team, vpt, v);
    const acc_t a = in_row(v, j) ? load_a(j) : acc_t(0);
    const acc_t sign = (in_row(v, j) && load_mask(j)) ? acc_t(1) : acc_t(-1);
    g[v] = a * (grad_lam * (sign - lam));
    if (has_grad_attention) g[v] += a * ((in_row(v, j) ? load_ga(j) : acc_t(0)) - dot);
  }
  if constexpr (BLUR) team_blur_adjoint(team, blur, d, vpt, buffer, spare, g);
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) {
    const int j = slot_position(team, vpt, v);
    if (in_row(v, j)) store(j, g[v]);
  }
}

// ---- sparsemax ----

// One row of sparsemax by a team, the row in registers (n <= size * VPT): rows holding NaN, or only
// -inf, give NaN (no result); else +inf entries take the mass; else Michelot's exact iteration
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
    const bool undefined = n_nan > 0 || row_max == -inf;
    SOPFAST_UNROLL
    for (int v = 0; v < VPT; ++v) {
      const int64_t i = rank + size * v;
      if (i >= n) continue;
      store(i, undefined ? quiet_nan<acc_t>() : (z[v] == inf ? acc_t(1) / acc_t(n_posinf) : acc_t(0)));
    }
    return;
  }
  SOPFAST_UNROLL
  for (int v = 0; v < VPT; ++v) z[v] -= row_max;
  acc_t tau = -1;
  int support = -1;
  while (true) {  // sass-loop: sparsemax_michelot
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

// A team of one thread (a row per thread), on the host and the device: every collective is the thread's own
// value.
struct SoloTeam {
  SOPFAST_HD int rank() const { return 0; }
  SOPFAST_HD int size() const { return 1; }
  SOPFAST_HD int lanes() const { return 1; }
  SOPFAST_HD int group() const { return 0; }
  SOPFAST_HD int lane() const { return 0; }
  template <typename T>
  SOPFAST_HD T sum(T v) const {
    return v;
  }
  template <typename T>
  SOPFAST_HD T max(T v) const {
    return v;
  }
  SOPFAST_HD uint32_t ballot(bool flag) const { return flag ? 1u : 0u; }
  SOPFAST_HD int groups_before(int count, int* total) const {
    *total = count;
    return 0;
  }
  SOPFAST_HD void sync() const {}
};

// Row stride of a chunk's staging tile: odd, so that the threads' rows fall in distinct shared-memory banks.
SOPFAST_HD constexpr int chunk_row_stride(int n) { return n | 1; }

// Sparsemax of a chunk of `rows` <= team.size() rows of N entries (N a compile-time constant) stored one
// after the other, one row per thread of the team (on the GPU a warp: 32 rows, 32 * N contiguous entries).
// The chunk's rows * N entries come in VEC at a time -- load(q, acc_t (&out)[VEC]) reads entries
// q * VEC .. q * VEC + VEC - 1, consecutive q on consecutive threads (coalesced) -- into tile
// [team.size() * chunk_row_stride(N)] (entry e -> row e / N, column e % N: a constant divisor, so
// multiplications, no division); each thread runs its row in registers (sparsemax_team_row alone, every
// index a constant) and writes it back to the tile; the results leave the same way (store(q, const acc_t
// (&values)[VEC])).  A team.sync() between the phases (__syncwarp on the GPU), no block barrier.  rows * N
// must be a multiple of VEC.
template <int N, int VEC, typename acc_t, typename Team, typename Load, typename Store>
SOPFAST_TEAM_FN void sparsemax_chunk_rows(const Team& team, int rows, acc_t* tile, Load load, Store store) {
  constexpr int stride = chunk_row_stride(N);
  const int vectors = rows * N / VEC;
  for (int q = team.rank(); q < vectors; q += team.size()) {
    acc_t values[VEC];
    load(q, values);
    SOPFAST_UNROLL
    for (int c = 0; c < VEC; ++c) {
      const unsigned e = static_cast<unsigned>(q * VEC + c);
      tile[(e / N) * stride + e % N] = values[c];
    }
  }
  team.sync();
  if (team.rank() < rows) {
    acc_t* mine = tile + team.rank() * stride;
    sparsemax_team_row<N, acc_t>(
        SoloTeam{}, N, [mine](int64_t i) { return mine[i]; }, [mine](int64_t i, acc_t p) { mine[i] = p; });
  }
  team.sync();
  for (int q = team.rank(); q < vectors; q += team.size()) {
    acc_t values[VEC];
    SOPFAST_UNROLL
    for (int c = 0; c < VEC; ++c) {
      const unsigned e = static_cast<unsigned>(q * VEC + c);
      values[c] = tile[(e / N) * stride + e % N];
    }
    store(q, values);
  }
  team.sync();  // every thread has read the tile: the next chunk may fill it
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
