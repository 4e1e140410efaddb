// The per-row algorithms of the CUDA kernels (csrc/team_rows.h), run on the host by teams of
// std::threads (host_team.h) of the sizes the GPU uses (8 lanes, a warp, a block of several warps),
// against the CPU kernels: top_tau forward (both tie rules, blur 1-D / 2-D, valid masks, saturated,
// uniform and tied rows) and backward, sparsemax forward (special rows) and backward, and the
// gather_tokens backward through the inverted index.  Also bounds their work: team-wide collectives
// per row (counting passes of the threshold search, none per value) and gradient rows read per token.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "cpu/sparsemax_kernels.h"
#include "cpu/top_tau_kernels.h"
#include "team_rows.h"
#include "tests/harness.h"
#include "tests/host_team.h"

namespace {

using sopfast::BlurSpec;
using sopfast::GatherTokensShape;
using sopfast::TopTauRow;
using sopfast::test::HostTeam;
using sopfast::test::run_host_team;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct TopTauCase {
  int64_t d = 0, k = 0;
  bool largest = true, ties_authors = true;
  std::vector<float> logits;
  std::vector<char> valid;  // empty: all valid
  std::vector<float> kernel;
  int64_t grid_h = 0, grid_w = 0;
};

struct TopTauOutputs {
  std::vector<int64_t> indices;
  std::vector<char> mask;
  std::vector<float> attention;
  float lam = 0;
  sopfast::test::HostTeamWork work;
};

TopTauOutputs run_cpu(const TopTauCase& c) {
  sopfast::cpu::TopTauProblem<float> pb;
  pb.d = c.d;
  pb.k_max = c.d;
  pb.largest = c.largest;
  pb.ties_authors = c.ties_authors;
  pb.blur_kernel = c.kernel.empty() ? nullptr : c.kernel.data();
  pb.blur_size = static_cast<int64_t>(c.kernel.size());
  pb.grid_h = c.grid_h;
  pb.grid_w = c.grid_w;
  sopfast::cpu::TopTauWorkspace<float> ws(c.d);
  std::unique_ptr<bool[]> valid(new bool[c.d]), mask(new bool[c.d]);
  for (int64_t j = 0; j < c.d; ++j) valid[j] = c.valid.empty() || c.valid[j];
  TopTauOutputs out;
  out.indices.resize(c.d);
  out.attention.resize(c.d);
  sopfast::cpu::top_tau_forward_row(pb, c.logits.data(), valid.get(), c.k, out.indices.data(), mask.get(), &out.lam,
                                    out.attention.data(), ws);
  out.mask.assign(mask.get(), mask.get() + c.d);
  return out;
}

template <int VPT, bool BLUR>
TopTauOutputs run_team(const TopTauCase& c, int team_size) {
  TopTauOutputs out;
  out.indices.assign(c.d, -7);
  out.attention.assign(c.d, -7.0f);
  std::unique_ptr<bool[]> mask(new bool[c.d]);
  std::vector<float> buffer(c.d);
  TopTauRow<float> row;
  row.d = c.d;
  row.k = c.k;
  row.k_max = c.d;
  row.largest = c.largest;
  row.ties_authors = c.ties_authors;
  row.blur.kernel = c.kernel.empty() ? nullptr : c.kernel.data();
  row.blur.size = static_cast<int64_t>(c.kernel.size());
  row.blur.grid_h = c.grid_h;
  row.blur.grid_w = c.grid_w;
  row.buffer = buffer.data();
  row.indices = out.indices.data();
  row.mask = mask.get();
  row.lam = &out.lam;
  row.attention = out.attention.data();
  out.work = run_host_team(team_size, [&](const HostTeam& team) {
    sopfast::top_tau_team_row<VPT, BLUR>(team, row, sopfast::per_position([&](int j) { return c.logits[j]; }),
                                         sopfast::per_position([&](int j) { return c.valid.empty() || c.valid[j]; }));
  });
  out.mask.assign(mask.get(), mask.get() + c.d);
  return out;
}

template <int VPT>
TopTauOutputs run_team_vpt(const TopTauCase& c, int team_size) {
  return c.kernel.empty() ? run_team<VPT, false>(c, team_size) : run_team<VPT, true>(c, team_size);
}

// The bound on the values per thread of the CUDA dispatch: 8 lanes 4, a warp 8 (d <= 256), 16
// (d <= 512) or 32, a block 32 -- most slots unused for short rows, as on the GPU.
TopTauOutputs run_team_for(const TopTauCase& c, int team_size) {
  if (team_size <= 8) return run_team_vpt<4>(c, team_size);
  if (team_size <= 32 && c.d <= 256) return run_team_vpt<8>(c, team_size);
  if (team_size <= 32 && c.d <= 512) return run_team_vpt<16>(c, team_size);
  return run_team_vpt<32>(c, team_size);
}

// Rows without a result included: both blank them (NaN lam and attention, no feature).
void expect_same(const TopTauOutputs& got, const TopTauOutputs& expected) {
  EXPECT(got.mask == expected.mask);
  EXPECT(got.indices == expected.indices);
  for (size_t j = 0; j < got.attention.size(); ++j) {
    const float a = got.attention[j], b = expected.attention[j];
    EXPECT((a != a && b != b) || std::fabs(a - b) <= 2e-6f);
  }
  EXPECT((got.lam != got.lam && expected.lam != expected.lam) || std::fabs(got.lam - expected.lam) <= 2e-6f);
}

TopTauCase random_case(std::mt19937& rng, int64_t d, int kind) {
  TopTauCase c;
  c.d = d;
  c.logits.resize(d);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> small(-2, 2);
  for (float& x : c.logits) {
    x = kind == 0 ? std::round(normal(rng) * 4.0f) : kind == 1 ? normal(rng) * 1000.0f : kind == 2 ? 0.25f : small(rng);
  }
  c.k = std::uniform_int_distribution<int64_t>(0, d)(rng);
  return c;
}

// Team sizes of the GPU: 8 lanes (d <= 32), a warp, and a block (here 64 threads in two warps: the
// same code, with the prefix counts across warps).
TEST_CASE(top_tau_team_row_matches_the_cpu_kernel) {
  std::mt19937 rng(21);
  std::bernoulli_distribution coin(0.75);
  const std::vector<float> kernel3 = {0.25f, 0.5f, 0.25f};
  for (int64_t d : {5, 32, 60, 196, 301}) {
    for (int team_size : {8, 32, 64}) {
      if ((team_size == 8 && d > 32) || (d > 256 && team_size != 32)) continue;  // 301: a warp at 16 values
      for (int kind = 0; kind < 4; ++kind) {  // rounded (ties), saturated, uniform, duplicates
        for (int rep = 0; rep < 2; ++rep) {
          TopTauCase c = random_case(rng, d, kind);
          for (bool authors : {true, false}) {
            for (bool largest : {true, false}) {
              for (int blur = 0; blur < 3; ++blur) {
                c.ties_authors = authors;
                c.largest = largest;
                c.kernel = blur == 0 || d < 5 ? std::vector<float>{} : kernel3;
                c.grid_h = blur == 2 && d % 4 == 0 ? 4 : 0;
                c.grid_w = c.grid_h ? d / 4 : 0;
                c.valid.clear();
                if (rep == 1) {
                  c.valid.resize(d);
                  for (auto& v : c.valid) v = coin(rng);
                  // the op keeps at most the valid features (the CPU kernel would fill up with invalid ones)
                  c.k = std::min<int64_t>(c.k, std::count(c.valid.begin(), c.valid.end(), 1));
                }
                expect_same(run_team_for(c, team_size), run_cpu(c));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE(top_tau_team_row_keeps_special_rows) {
  TopTauCase c;
  c.d = 7;
  for (const auto& row : std::vector<std::vector<float>>{{kInf, 0.0f, kInf, -1.0f, 2.0f, kInf, 1.0f},
                                                         {std::nanf(""), 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f},
                                                         {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},
                                                         {0.0f, -90.0f, -95.0f, -100.0f, -103.0f, -200.0f, -1.0f}}) {
    c.logits = row;
    for (bool authors : {true, false}) {
      for (bool largest : {true, false}) {
        for (int64_t k : {0, 1, 3, 7}) {
          c.ties_authors = authors;
          c.largest = largest;
          c.k = k;
          expect_same(run_team_for(c, 8), run_cpu(c));
        }
      }
    }
  }
}

// The authors' rule ranks the logits, with the logits whose exp underflows to 0 (x <= the cut) in one
// tie class: higher index first when keeping the largest, lower when keeping the smallest -- on a team
// (8 lanes, a warp) as in the CPU kernel, with the expected groups of tests/test_ops_top_tau_ties.py.
TEST_CASE(top_tau_team_row_ranks_the_authors_scores) {
  const float cut = sopfast::SoftmaxZero<float>::at, above = std::nextafter(cut, 0.0f);
  TopTauCase c;
  c.d = 6;
  c.logits = {0.0f, cut, above, cut, above, cut - 1.0f};
  c.ties_authors = true;
  auto kept = [&](const TopTauOutputs& out, int64_t k) {
    return std::vector<int64_t>(out.indices.begin(), out.indices.begin() + k);
  };
  for (int team_size : {8, 32}) {
    for (bool largest : {true, false}) {
      c.largest = largest;
      c.k = 4;
      const TopTauOutputs out = run_team_for(c, team_size);
      expect_same(out, run_cpu(c));
      EXPECT((kept(out, 4) == (largest ? std::vector<int64_t>{0, 2, 4, 5} : std::vector<int64_t>{1, 2, 3, 5})));
      EXPECT(out.attention[1] == 0.0f && out.attention[2] > 0.0f);
      c.k = 2;
      expect_same(run_team_for(c, team_size), run_cpu(c));
      EXPECT((kept(run_team_for(c, team_size), 2) == (largest ? std::vector<int64_t>{0, 4} : std::vector<int64_t>{1, 3})));
    }
  }
}

// The threshold search stops early: a row of 196 costs a few dozen team collectives in all, not
// the O(d^2) comparisons of ranking every feature against every other; and the selection costs two
// scans over the warps whatever the values per thread (ballots within a warp place the rest).
TEST_CASE(top_tau_team_row_work_is_bounded) {
  std::mt19937 rng(5);
  int64_t total = 0;
  const int rows = 50;
  for (int r = 0; r < rows; ++r) {
    TopTauCase c = random_case(rng, 196, 0);
    for (float& x : c.logits) x = std::normal_distribution<float>()(rng);
    c.k = 39;
    const TopTauOutputs out = run_team_for(c, 64);
    // 4 statistics + softmax sum + at most 32 search steps + 2 scans + lam
    EXPECT(out.work.collectives <= 4 + 1 + 32 + 2 + 1);
    EXPECT(out.work.ballots == 2 * 2 * 4);  // 2 flags, in 2 passes, per used value of a thread (196 / 64 -> 4)
    total += out.work.collectives;
  }
  EXPECT(total / rows <= 4 + 1 + 20 + 2 + 1);
}

TEST_CASE(top_tau_backward_team_row_matches_the_cpu_kernel) {
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  const std::vector<float> kernel5 = {0.1f, 0.2f, 0.4f, 0.2f, 0.1f};
  for (int64_t d : {24, 60}) {
    for (int blur = 0; blur < 3; ++blur) {
      for (bool with_ga : {false, true}) {
        std::vector<float> a(d), ga(d), expected(d), got(d, -7.0f);
        std::unique_ptr<bool[]> mask(new bool[d]);
        for (int64_t j = 0; j < d; ++j) a[j] = std::fabs(normal(rng)) / d, ga[j] = normal(rng), mask[j] = j % 3 == 0;
        const float lam = 0.3f, grad_lam = -1.7f;
        sopfast::cpu::TopTauProblem<float> pb;
        pb.d = d;
        pb.blur_kernel = blur ? kernel5.data() : nullptr;
        pb.blur_size = blur ? 5 : 0;
        pb.grid_h = blur == 2 ? 6 : 0;
        pb.grid_w = blur == 2 ? d / 6 : 0;
        sopfast::cpu::TopTauWorkspace<float> ws(d);
        sopfast::cpu::top_tau_backward_row(pb, a.data(), mask.get(), lam, grad_lam, with_ga ? ga.data() : nullptr,
                                           expected.data(), ws);
        BlurSpec<float> spec;
        spec.kernel = pb.blur_kernel;
        spec.size = pb.blur_size;
        spec.grid_h = pb.grid_h;
        spec.grid_w = pb.grid_w;
        for (int team_size : {32, 64}) {  // a warp (2 values per thread), two warps (1)
          std::vector<float> buffer(d), spare(d);
          std::fill(got.begin(), got.end(), -7.0f);
          run_host_team(team_size, [&](const HostTeam& team) {
            auto run = [&](auto blur_flag) {
              sopfast::top_tau_backward_team_row<2, decltype(blur_flag)::value>(
                  team, static_cast<int>(d), lam, grad_lam, with_ga, spec, buffer.data(), spare.data(),
                  [&](int j) { return a[j]; }, [&](int j) { return mask[j]; }, [&](int j) { return ga[j]; },
                  [&](int j, float g) { got[j] = g; });
            };
            blur ? run(std::true_type{}) : run(std::false_type{});
          });
          for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(got[j], expected[j], 1e-6);
        }
      }
    }
  }
}

template <int VPT>
std::vector<float> team_sparsemax(const std::vector<float>& x, int team_size) {
  std::vector<float> p(x.size(), -7.0f);
  run_host_team(team_size, [&](const HostTeam& team) {
    sopfast::sparsemax_team_row<VPT, float>(
        team, static_cast<int64_t>(x.size()), [&](int64_t i) { return x[i]; },
        [&](int64_t i, float value) { p[i] = value; });
  });
  return p;
}

// 4 lanes for rows of up to 32 entries (as on the GPU), a warp for longer ones.
TEST_CASE(sparsemax_team_row_matches_the_cpu_kernel) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> rows = {{kInf, std::nanf(""), 1.0f, kInf}, {std::nanf(""), 1.0f, 2.0f},
                                          {-kInf, -kInf, -kInf},             {3.0f, 3.0f, -1.0f, 2.5f},
                                          {1e30f, -1e30f, 1e30f},            {0.5f}};
  for (int n : {7, 20, 32, 33, 200}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng) * 3.0f;
    rows.push_back(x);
  }
  for (const auto& x : rows) {
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<float> expected(n), work(n);
    sopfast::cpu::sparsemax_forward_row<float, float>(x.data(), expected.data(), n, work.data());
    const std::vector<float> got = n <= 32 ? team_sparsemax<8>(x, 4) : team_sparsemax<8>(x, 32);
    if (expected[0] != expected[0]) continue;  // a row without a result: the CUDA binding blanks it after the kernel
    for (int64_t i = 0; i < n; ++i) {
      EXPECT((got[i] != got[i] && expected[i] != expected[i]) || std::fabs(got[i] - expected[i]) <= 2e-6f);
    }
  }
}

// The warp-rows kernel's chunk (32 rows of N entries, one per lane of a warp, staged through the tile): every
// row as the thread-rows kernel's (sparsemax_team_row alone on it), bit for bit, and within 2e-6 of the CPU
// kernel -- with vector loads (VEC 4) and entry by entry, a full chunk and a last partial one, special rows.
template <int N, int VEC>
void check_chunk(std::mt19937& rng, int rows) {
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * N), got(rows * N, -7.0f), tile(32 * sopfast::chunk_row_stride(N), -7.0f);
  for (float& v : x) v = normal(rng) * 3.0f;
  if (rows >= 4) {
    x[0] = kInf;                  // row 0: the mass on its +inf entries
    x[N] = std::nanf("");         // row 1: no result
    for (int i = 0; i < N; ++i) x[2 * N + i] = -kInf;  // row 2: no result
    x[3 * N] = x[3 * N + N - 1];  // row 3: a tie
  }
  run_host_team(32, [&](const HostTeam& team) {
    sopfast::sparsemax_chunk_rows<N, VEC, float>(
        team, rows, tile.data(),
        [&](int q, float(&values)[VEC]) {
          for (int c = 0; c < VEC; ++c) values[c] = x[q * VEC + c];
        },
        [&](int q, const float(&values)[VEC]) {
          for (int c = 0; c < VEC; ++c) got[q * VEC + c] = values[c];
        });
  });
  for (int r = 0; r < rows; ++r) {
    std::vector<float> alone(N, -7.0f), expected(N), work(N);
    sopfast::sparsemax_team_row<32, float>(
        sopfast::SoloTeam{}, N, [&](int64_t i) { return x[r * N + i]; }, [&](int64_t i, float p) { alone[i] = p; });
    sopfast::cpu::sparsemax_forward_row<float, float>(x.data() + r * N, expected.data(), N, work.data());
    for (int i = 0; i < N; ++i) {
      const float g = got[r * N + i];
      EXPECT((g != g && alone[i] != alone[i]) || g == alone[i]);
      EXPECT((g != g && expected[i] != expected[i]) || std::fabs(g - expected[i]) <= 2e-6f);
    }
  }
}

TEST_CASE(sparsemax_chunk_rows_match_the_thread_rows_kernel) {
  std::mt19937 rng(29);
  check_chunk<20, 4>(rng, 32);
  check_chunk<20, 1>(rng, 32);
  check_chunk<20, 1>(rng, 7);
  check_chunk<3, 4>(rng, 32);
  check_chunk<32, 4>(rng, 32);
  check_chunk<1, 1>(rng, 5);
}

TEST_CASE(sparsemax_backward_team_row_matches_the_cpu_kernel) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  for (int n : {3, 20, 300}) {
    std::vector<float> p(n), g(n), expected(n), got(n, -7.0f);
    for (int i = 0; i < n; ++i) p[i] = i % 4 == 0 ? 0.0f : std::fabs(normal(rng)), g[i] = normal(rng);
    sopfast::cpu::sparsemax_backward_row<float, float>(p.data(), g.data(), expected.data(), n);
    run_host_team(n <= 32 ? 4 : 32, [&](const HostTeam& team) {
      sopfast::sparsemax_backward_team_row<float>(
          team, n, [&](int64_t i) { return p[i]; }, [&](int64_t i) { return g[i]; },
          [&](int64_t i, float value) { got[i] = value; });
    });
    for (int i = 0; i < n; ++i) EXPECT_NEAR(got[i], expected[i], 1e-6);
  }
}

// The inverted index lists each token's entries in increasing order, and the per-token sums read
// every gradient row of a body entry exactly once (the old kernel scanned all m * (p + k) indices
// for each of the T tokens).
TEST_CASE(gather_tokens_backward_through_the_inverted_index) {
  GatherTokensShape sh;
  sh.batch = 3;
  sh.tokens = 11;
  sh.embed = 5;
  sh.groups = 4;
  sh.keep = 6;
  sh.prefix = 2;
  std::mt19937 rng(4);
  std::uniform_int_distribution<int64_t> token(-1, sh.tokens);  // -1 and T: skipped
  const int64_t body = sh.groups * sh.keep, rows = sh.batch * sh.groups * sh.slots();
  std::vector<int64_t> indices(sh.batch * body);
  for (int64_t& i : indices) i = token(rng);
  std::vector<double> grad(rows * sh.embed);
  for (double& g : grad) g = std::normal_distribution<double>()(rng);
  std::vector<int64_t> offsets(sh.batch * (sh.tokens + 1)), entries(sh.batch * body), counts(sh.tokens);
  for (int64_t b = 0; b < sh.batch; ++b) {
    sopfast::gather_tokens_csr_build(sh, indices.data(), b, offsets.data(), entries.data(), counts.data());
    for (int64_t t = 0; t < sh.tokens; ++t) {
      const int64_t* first = entries.data() + offsets[b * (sh.tokens + 1) + t];
      const int64_t* last = entries.data() + offsets[b * (sh.tokens + 1) + t + 1];
      EXPECT(std::is_sorted(first, last));
      for (const int64_t* e = first; e < last; ++e) EXPECT(indices[b * body + *e] == t);
    }
  }
  std::vector<double> expected(sh.batch * sh.tokens * sh.embed, 0.0), got(expected.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t group_row = r / sh.slots(), slot = r % sh.slots(), b = group_row / sh.groups;
    const int64_t t = slot < sh.prefix ? slot : indices[group_row * sh.keep + slot - sh.prefix];
    if (t < 0 || t >= sh.tokens) continue;
    for (int64_t c = 0; c < sh.embed; ++c) expected[(b * sh.tokens + t) * sh.embed + c] += grad[r * sh.embed + c];
  }
  std::vector<int64_t> reads(rows, 0);
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t t = 0; t < sh.tokens; ++t) {
      double acc[2];
      for (int64_t c0 = 0; c0 < 2; ++c0) {  // two threads, columns c0, c0 + 2, c0 + 4
        double column_acc[3];
        sopfast::gather_tokens_backward_token(sh, offsets.data(), entries.data(), b, t, c0, 3, 2,
                                              [&](int64_t row, int64_t c) {
                                                reads[row] += c0 == 0 && c == 0;
                                                return c < sh.embed ? grad[row * sh.embed + c] : 0.0;
                                              },
                                              column_acc);
        for (int64_t v = 0; v < 3 && c0 + 2 * v < sh.embed; ++v) {
          got[(b * sh.tokens + t) * sh.embed + c0 + 2 * v] = column_acc[v];
        }
        acc[c0] = column_acc[0];
      }
      EXPECT(acc[0] == got[(b * sh.tokens + t) * sh.embed]);
    }
  }
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-12);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t group_row = r / sh.slots(), slot = r % sh.slots();
    const int64_t t = slot < sh.prefix ? slot : indices[group_row * sh.keep + slot - sh.prefix];
    EXPECT(reads[r] == (t >= 0 && t < sh.tokens ? 1 : 0));
  }
}

}  // namespace

TEST_MAIN()
