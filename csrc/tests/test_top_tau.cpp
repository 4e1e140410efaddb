// Unit tests of the top_tau CPU kernels and of the row math they share with the CUDA kernels
// (top_tau_row.h): key order, the softmax exp (subnormals kept), the threshold search, reflect
// padding, blur adjointness, the row kernel against a brute-force stable sort for both tie rules,
// and the torch entry points.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/top_tau_kernels.h"
#include "ops.h"
#include "tests/harness.h"

namespace {

using sopfast::cpu::TopTauProblem;
using sopfast::cpu::TopTauWorkspace;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST_CASE(reflect_padding_skips_the_edge) {
  EXPECT(sopfast::reflect_index(-1, 5) == 1);
  EXPECT(sopfast::reflect_index(-2, 5) == 2);
  EXPECT(sopfast::reflect_index(0, 5) == 0);
  EXPECT(sopfast::reflect_index(5, 5) == 3);
  EXPECT(sopfast::reflect_index(6, 5) == 2);
}

TEST_CASE(ordered_bits_sort_like_torch) {
  const std::vector<float> ascending = {-kInf, -3e38f, -1.0f, -1e-40f, 0.0f, 1e-40f, 2.0f, 3e38f, kInf};
  for (size_t i = 1; i < ascending.size(); ++i) {
    EXPECT(sopfast::ordered_bits(ascending[i - 1]) < sopfast::ordered_bits(ascending[i]));
  }
  EXPECT(sopfast::ordered_bits(-0.0f) == sopfast::ordered_bits(0.0f));
  EXPECT(sopfast::ordered_bits(std::nanf("")) > sopfast::ordered_bits(kInf));
  EXPECT(sopfast::ordered_bits(-std::nanf("")) > sopfast::ordered_bits(kInf));
  EXPECT(sopfast::ordered_bits(-0.0) == sopfast::ordered_bits(0.0));
  EXPECT(sopfast::ordered_bits(-1.0) < sopfast::ordered_bits(1e-300));
}

TEST_CASE(keys_rank_valid_first_then_value_then_index) {
  using sopfast::top_tau_key;
  for (bool higher_first : {false, true}) {
    EXPECT(top_tau_key(-5.0f, true, true, 3, higher_first) > top_tau_key(5.0f, false, true, 0, higher_first));
    EXPECT(top_tau_key(2.0f, true, true, 3, higher_first) > top_tau_key(1.0f, true, true, 0, higher_first));
    EXPECT(top_tau_key(1.0f, true, false, 3, higher_first) > top_tau_key(2.0f, true, false, 0, higher_first));
    EXPECT(top_tau_key(std::nan(""), true, false, 0, higher_first) < top_tau_key(-1e300, true, false, 1, higher_first));
  }
  EXPECT(top_tau_key(1.0f, true, true, 2, false) > top_tau_key(1.0f, true, true, 3, false));
  EXPECT(top_tau_key(1.0, true, true, 2, false) > top_tau_key(1.0, true, true, 3, false));
  EXPECT(top_tau_key(1.0f, true, true, 2, true) < top_tau_key(1.0f, true, true, 3, true));
  EXPECT(top_tau_key(1.0, true, true, 2, true) < top_tau_key(1.0, true, true, 3, true));
}

TEST_CASE(softmax_exp_is_within_one_ulp) {
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f) {
    const float exact = static_cast<float>(std::exp(static_cast<double>(x)));
    const float ulp = std::nextafter(exact, kInf) - exact;
    EXPECT_NEAR(sopfast::softmax_exp(x), exact, 1.01 * ulp);
  }
  EXPECT(sopfast::softmax_exp(0.0f) == 1.0f);
  EXPECT(sopfast::softmax_exp(-kInf) == 0.0f);
}

// torch's softmax keeps subnormal results (softmax([0, -90]) = [1, 8.19e-40]; 0 only below about
// -103.97): the exp must too, within one step of the subnormal grid (2^-149), and stay monotone.
TEST_CASE(softmax_exp_keeps_subnormals) {
  const double quantum = std::ldexp(1.0, -149);
  float previous = 0.0f;
  int64_t nonzero = 0;
  for (float x = -105.0f; x <= -86.0f; x += 0.00173f) {
    const double exact = std::exp(static_cast<double>(x));
    const float got = sopfast::softmax_exp(x);
    EXPECT_NEAR(got, exact, x < -87.3f ? 1.01 * quantum : 2e-7 * exact);
    EXPECT(got >= previous);
    previous = got;
    nonzero += got > 0.0f;
  }
  EXPECT(nonzero > 10000);
  EXPECT(sopfast::softmax_exp(-90.0f) > 8.1e-40f && sopfast::softmax_exp(-90.0f) < 8.3e-40f);
  EXPECT(sopfast::softmax_exp(-103.9f) > 0.0f);
  EXPECT(sopfast::softmax_exp(-104.1f) == 0.0f);
}

// KthLargestSearch against sorting, with many ties and early exits.
TEST_CASE(threshold_search_finds_the_kth_largest) {
  std::mt19937 rng(5);
  for (int rep = 0; rep < 300; ++rep) {
    const int64_t d = std::uniform_int_distribution<int64_t>(1, 80)(rng);
    const uint32_t spread = rep % 3 == 0 ? 4u : 0xFFFFFFFFu;
    std::vector<uint32_t> keys(d);
    for (auto& key : keys) key = std::uniform_int_distribution<uint32_t>(0, spread)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, d)(rng);
    sopfast::KthLargestSearch<uint32_t> search;
    int steps = 0;
    while (search.running()) {
      const uint32_t t = search.candidate();
      search.step(std::count_if(keys.begin(), keys.end(), [t](uint32_t key) { return key >= t; }), k);
      ++steps;
    }
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const auto at_least = std::count_if(keys.begin(), keys.end(), [&](uint32_t v) { return v >= search.threshold; });
    if (search.exact) {
      EXPECT(at_least == k && (k == d || sorted[k] < search.threshold));
    } else {
      EXPECT(search.threshold == sorted[k - 1]);
    }
    EXPECT(steps <= 32);
  }
}

// <blur(x), y> == <x, blur^T(y)> for the line and column passes.
TEST_CASE(blur_adjoint_is_the_transpose) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  const std::vector<double> kernel = {0.1, 0.2, 0.4, 0.2, 0.1};
  const int64_t h = 4, w = 6, d = h * w;
  std::vector<double> x(d), y(d), bx(d), bty(d);
  for (int64_t i = 0; i < d; ++i) x[i] = normal(rng), y[i] = normal(rng);
  auto dot = [](const std::vector<double>& a, const std::vector<double>& b) {
    return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
  };
  sopfast::cpu::blur_lines(x.data(), bx.data(), h, w, kernel.data(), 5);
  sopfast::cpu::blur_lines_adjoint(y.data(), bty.data(), h, w, kernel.data(), 5);
  EXPECT_NEAR(dot(bx, y), dot(x, bty), 1e-12);
  sopfast::cpu::blur_columns(x.data(), bx.data(), h, w, kernel.data(), 5);
  sopfast::cpu::blur_columns_adjoint(y.data(), bty.data(), h, w, kernel.data(), 5);
  EXPECT_NEAR(dot(bx, y), dot(x, bty), 1e-12);
  // a constant row stays constant under a normalised kernel
  std::vector<double> ones(d, 1.0);
  sopfast::cpu::blur_columns(ones.data(), bx.data(), h, w, kernel.data(), 5);
  for (double v : bx) EXPECT_NEAR(v, 1.0, 1e-15);
}

// Brute force: stable sort of (valid desc, value by `largest`, index asc or desc), keep the first k.
std::vector<bool> brute_force_mask(const std::vector<float>& s, const std::vector<bool>& valid, int64_t k,
                                   bool largest, bool higher_first = false) {
  std::vector<int64_t> order(s.size());
  std::iota(order.begin(), order.end(), 0);
  if (higher_first) std::reverse(order.begin(), order.end());
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (valid[a] != valid[b]) return static_cast<bool>(valid[a]);
    return largest ? s[a] > s[b] : s[a] < s[b];
  });
  std::vector<bool> mask(s.size(), false);
  for (int64_t r = 0; r < k; ++r) mask[order[r]] = true;
  return mask;
}

TEST_CASE(row_kernel_matches_brute_force_with_ties) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-3, 3);  // many ties
  std::bernoulli_distribution coin(0.7);
  for (bool authors : {false, true}) {
    for (bool largest : {true, false}) {
      for (int64_t d : {1, 2, 7, 40, 196}) {
        TopTauProblem<float> pb;
        pb.d = d;
        pb.k_max = d;
        pb.largest = largest;
        pb.ties_authors = authors;
        TopTauWorkspace<float> ws(d);
        for (int rep = 0; rep < 30; ++rep) {
          std::vector<float> logits(d);
          std::vector<bool> valid(d);
          std::unique_ptr<bool[]> valid_raw(new bool[d]);
          for (int64_t j = 0; j < d; ++j) logits[j] = small(rng), valid[j] = valid_raw[j] = coin(rng);
          const int64_t k = std::uniform_int_distribution<int64_t>(0, d)(rng);
          std::vector<int64_t> indices(d);
          std::unique_ptr<bool[]> mask(new bool[d]);
          std::vector<float> attention(d);
          float lam = 0;
          sopfast::cpu::top_tau_forward_row(pb, logits.data(), valid_raw.get(), k, indices.data(), mask.get(), &lam,
                                            attention.data(), ws);
          // the authors' rule ranks the attention: the order of the logits here (softmax is monotone,
          // equal logits give equal attention) with invalid features all 0, ties to the higher index
          // if largest
          std::vector<float> scores = logits;
          for (int64_t j = 0; j < d; ++j) scores[j] = authors && !valid[j] ? 0.0f : scores[j];
          const bool any_valid = std::find(valid.begin(), valid.end(), true) != valid.end();
          // a row without a valid feature has no result: no feature kept, NaN lam
          const std::vector<bool> expected =
              any_valid ? brute_force_mask(scores, valid, k, largest, authors && largest) : std::vector<bool>(d, false);
          float kept = 0, total = 0;
          int64_t pos = 0;
          for (int64_t j = 0; j < d; ++j) {
            EXPECT(mask[j] == expected[j]);
            if (expected[j]) EXPECT(indices[pos++] == j);
            kept += mask[j] ? attention[j] : 0.0f;
            total += valid[j] ? attention[j] : 0.0f;
          }
          for (; pos < d; ++pos) EXPECT(indices[pos] == -1);
          EXPECT(any_valid || lam != lam);
          if (any_valid) {
            for (int64_t j = 0; j < d; ++j) EXPECT(valid[j] || attention[j] == 0.0f);
            EXPECT_NEAR(total, 1.0, 1e-5);
            EXPECT_NEAR(lam, 2 * kept - 1, 1e-5);
          }
        }
      }
    }
  }
}

// Saturated rows: attention that underflows to exactly 0 ties; the authors' rule keeps the zeros
// with the highest indices (lowest for largest=false), the logits rule ranks the logits.
TEST_CASE(authors_rule_breaks_underflow_ties_by_the_higher_index) {
  const std::vector<float> logits = {0.0f, -200.0f, -300.0f, 5.0f, -250.0f, -90.0f, -1000.0f};
  const int64_t d = static_cast<int64_t>(logits.size());
  auto kept = [&](bool authors, bool largest, int64_t k) {
    TopTauProblem<float> pb;
    pb.d = d;
    pb.k_max = d;
    pb.largest = largest;
    pb.ties_authors = authors;
    TopTauWorkspace<float> ws(d);
    std::vector<int64_t> indices(d);
    std::unique_ptr<bool[]> mask(new bool[d]);
    std::vector<float> attention(d);
    float lam = 0;
    sopfast::cpu::top_tau_forward_row(pb, logits.data(), static_cast<const bool*>(nullptr), k, indices.data(),
                                      mask.get(), &lam, attention.data(), ws);
    return std::vector<int64_t>(indices.begin(), indices.begin() + k);
  };
  // attention: [e^-5, 0, 0, ~1, 0, e^-95 (subnormal), 0]
  EXPECT((kept(true, true, 4) == std::vector<int64_t>{0, 3, 5, 6}));
  EXPECT((kept(false, true, 4) == std::vector<int64_t>{0, 1, 3, 5}));
  EXPECT((kept(true, false, 2) == std::vector<int64_t>{1, 2}));
  EXPECT((kept(false, false, 2) == std::vector<int64_t>{2, 6}));
}

TEST_CASE(torch_entry_points) {
  const at::Tensor logits = at::randn({50, 196});
  const at::Tensor k = at::full({50}, 39, at::kLong);
  const at::Tensor kernel = at::ones({3}) / 3;
  auto [indices, mask, lam, attention] =
      sopfast::top_tau_forward<c10::kCPU>(logits, k, 39, std::nullopt, true, false, kernel, 14, 14, true, false);
  EXPECT(indices.sizes() == at::IntArrayRef({50, 39}) && mask.sum().item<int64_t>() == 50 * 39);
  EXPECT(lam.scalar_type() == at::kFloat && (lam.abs() <= 1).all().item<bool>());
  const at::Tensor grad =
      sopfast::top_tau_backward<c10::kCPU>(attention, mask, lam, at::ones({50}), std::nullopt, kernel, 14, 14);
  EXPECT(grad.sizes() == logits.sizes());
  auto half =
      sopfast::top_tau_forward<c10::kCPU>(logits.to(at::kHalf), k, 39, std::nullopt, false, false, std::nullopt, 0, 0, true, false);
  EXPECT(std::get<2>(half).scalar_type() == at::kFloat);
}

TEST_CASE(torch_entry_points_reject_bad_inputs) {
  const at::Tensor logits = at::randn({4, 6});
  const at::Tensor k = at::full({4}, 2, at::kLong);
  auto forward = [&](const at::Tensor& counts, int64_t k_max, const std::optional<at::Tensor>& kernel, int64_t grid) {
    return sopfast::top_tau_forward<c10::kCPU>(logits, counts, k_max, std::nullopt, true, false, kernel, grid, grid, true, false);
  };
  EXPECT_THROWS(forward(k.to(at::kInt), 2, std::nullopt, 0));
  EXPECT_THROWS(forward(k, 7, std::nullopt, 0));
  EXPECT_THROWS(forward(k, 2, at::ones({4}), 0));
  EXPECT_THROWS(forward(k, 2, at::ones({13}), 0));
  EXPECT_THROWS(forward(k, 2, std::nullopt, 4));
  EXPECT_THROWS(sopfast::top_tau_backward<c10::kCPU>(logits.to(at::kHalf), at::ones({4, 6}, at::kBool), at::ones({4}),
                                              at::ones({4}), std::nullopt, std::nullopt, 0, 0));
}

TEST_CASE(per_row_k_outside_one_to_k_max_and_mixed_devices_are_refused) {
  const at::Tensor logits = at::randn({2, 5});
  auto forward = [&](const std::optional<at::Tensor>& counts, int64_t k_max, const std::optional<at::Tensor>& valid) {
    return sopfast::top_tau_forward<c10::kCPU>(logits, counts, k_max, valid, true, true, std::nullopt, 0, 0, true,
                                               false);
  };
  const at::Tensor nine = at::full({2}, 9, at::kLong);
  EXPECT_THROWS_WITH(forward(nine, 3, std::nullopt), c10::ValueError, "k must lie in [1, k_max=3]");
  EXPECT_THROWS_WITH(forward(at::tensor({int64_t{-2}, int64_t{1}}), 3, std::nullopt), c10::ValueError, "got -2");
  EXPECT_THROWS_WITH(forward(at::tensor({int64_t{1}, int64_t{0}}), 3, std::nullopt), c10::ValueError,
                     "got 0 (element 1)");
  EXPECT_THROWS_WITH(forward(std::nullopt, 0, std::nullopt), c10::ValueError, "k_max");
  EXPECT_THROWS_WITH(forward(at::ones({2}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)), 1, std::nullopt),
                     c10::ValueError, "k is on meta but logits is on cpu");
  EXPECT_THROWS_WITH(forward(std::nullopt, 2, at::ones({2, 5}, at::TensorOptions().dtype(at::kBool).device(at::kMeta))),
                     c10::ValueError, "valid is on meta");
  EXPECT_THROWS_WITH(forward(nine.to(at::kInt), 3, std::nullopt), c10::TypeError, "k must be Long");
  // k = k_max passes; no rows need no k_max
  const at::Tensor valid = at::arange(5).lt(3).expand({2, 5}).contiguous();  // the first 3 features
  EXPECT(std::get<1>(forward(at::full({2}, 3, at::kLong), 3, valid)).sum().item<int64_t>() == 6);
  EXPECT(std::get<0>(sopfast::top_tau_forward<c10::kCPU>(at::randn({0, 5}), at::zeros({0}, at::kLong), 0,
                                                         std::nullopt, true, true, std::nullopt, 0, 0, true, false))
             .size(1) == 0);
}

}  // namespace

TEST_MAIN()
