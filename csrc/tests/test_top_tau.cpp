// Unit tests of the top_tau CPU kernels: key order, reflect padding, blur adjointness, the row
// kernel against a brute-force stable sort, and the torch entry points.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "ops.h"
#include "cpu/top_tau_kernels.h"
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

TEST_CASE(keys_rank_valid_first_then_value_then_lower_index) {
  using sopfast::top_tau_key;
  EXPECT(top_tau_key(-5.0f, true, true, 3) > top_tau_key(5.0f, false, true, 0));
  EXPECT(top_tau_key(2.0f, true, true, 3) > top_tau_key(1.0f, true, true, 0));
  EXPECT(top_tau_key(1.0f, true, false, 3) > top_tau_key(2.0f, true, false, 0));
  EXPECT(top_tau_key(1.0f, true, true, 2) > top_tau_key(1.0f, true, true, 3));
  EXPECT(top_tau_key(1.0, true, true, 2) > top_tau_key(1.0, true, true, 3));
  EXPECT(top_tau_key(std::nan(""), true, false, 0) < top_tau_key(-1e300, true, false, 1));
}

TEST_CASE(softmax_exp_is_within_one_ulp) {
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f) {
    const float exact = static_cast<float>(std::exp(static_cast<double>(x)));
    const float ulp = std::nextafter(exact, kInf) - exact;
    EXPECT_NEAR(sopfast::cpu::softmax_exp(x), exact, 1.01 * ulp);
  }
  EXPECT(sopfast::cpu::softmax_exp(0.0f) == 1.0f);
  EXPECT(sopfast::cpu::softmax_exp(-kInf) == 0.0f);
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

// Brute force: stable sort of (valid desc, value by `largest`, index asc), keep the first k.
std::vector<bool> brute_force_mask(const std::vector<float>& s, const std::vector<bool>& valid, int64_t k,
                                   bool largest) {
  std::vector<int64_t> order(s.size());
  std::iota(order.begin(), order.end(), 0);
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
  for (bool largest : {true, false}) {
    for (int64_t d : {1, 2, 7, 40, 196}) {
      TopTauProblem<float> pb;
      pb.d = d;
      pb.k_max = d;
      pb.largest = largest;
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
        const std::vector<bool> expected = brute_force_mask(logits, valid, k, largest);
        float kept = 0, total = 0;
        int64_t pos = 0;
        for (int64_t j = 0; j < d; ++j) {
          EXPECT(mask[j] == expected[j]);
          if (expected[j]) EXPECT(indices[pos++] == j);
          kept += mask[j] ? attention[j] : 0.0f;
          total += valid[j] ? attention[j] : 0.0f;
        }
        for (; pos < d; ++pos) EXPECT(indices[pos] == -1);
        if (std::find(valid.begin(), valid.end(), true) != valid.end()) {  // else the softmax is NaN
          for (int64_t j = 0; j < d; ++j) EXPECT(valid[j] || attention[j] == 0.0f);
          EXPECT_NEAR(total, 1.0, 1e-5);
          EXPECT_NEAR(lam, 2 * kept - 1, 1e-5);
        }
      }
    }
  }
}

TEST_CASE(torch_entry_points) {
  const at::Tensor logits = at::randn({50, 196});
  const at::Tensor k = at::full({50}, 39, at::kLong);
  const at::Tensor kernel = at::ones({3}) / 3;
  auto [indices, mask, lam, attention] =
      sopfast::top_tau_forward<c10::kCPU>(logits, k, 39, std::nullopt, true, false, kernel, 14, 14);
  EXPECT(indices.sizes() == at::IntArrayRef({50, 39}) && mask.sum().item<int64_t>() == 50 * 39);
  EXPECT(lam.scalar_type() == at::kFloat && (lam.abs() <= 1).all().item<bool>());
  const at::Tensor grad =
      sopfast::top_tau_backward<c10::kCPU>(attention, mask, lam, at::ones({50}), std::nullopt, kernel, 14, 14);
  EXPECT(grad.sizes() == logits.sizes());
  auto half =
      sopfast::top_tau_forward<c10::kCPU>(logits.to(at::kHalf), k, 39, std::nullopt, false, false, std::nullopt, 0, 0);
  EXPECT(std::get<2>(half).scalar_type() == at::kFloat);
}

TEST_CASE(torch_entry_points_reject_bad_inputs) {
  const at::Tensor logits = at::randn({4, 6});
  const at::Tensor k = at::full({4}, 2, at::kLong);
  auto forward = [&](const at::Tensor& counts, int64_t k_max, const std::optional<at::Tensor>& kernel, int64_t grid) {
    return sopfast::top_tau_forward<c10::kCPU>(logits, counts, k_max, std::nullopt, true, false, kernel, grid, grid);
  };
  EXPECT_THROWS(forward(k.to(at::kInt), 2, std::nullopt, 0));
  EXPECT_THROWS(forward(k, 7, std::nullopt, 0));
  EXPECT_THROWS(forward(k, 2, at::ones({4}), 0));
  EXPECT_THROWS(forward(k, 2, at::ones({13}), 0));
  EXPECT_THROWS(forward(k, 2, std::nullopt, 4));
  EXPECT_THROWS(sopfast::top_tau_backward<c10::kCPU>(logits.to(at::kHalf), at::ones({4, 6}, at::kBool), at::ones({4}),
                                              at::ones({4}), std::nullopt, std::nullopt, 0, 0));
}

}  // namespace

TEST_MAIN()
