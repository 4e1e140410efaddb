// Unit tests of the sparsemax CPU kernels: the raw row kernels against a sort-based solver,
// special rows, the backward, and the torch entry points (dtypes, checks).
#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "ops.h"
#include "cpu/sparsemax_kernels.h"
#include "tests/harness.h"

namespace {

using sopfast::cpu::sparsemax_backward_row;
using sopfast::cpu::sparsemax_forward_row;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> sparsemax_of(const std::vector<double>& x) {
  std::vector<double> p(x.size()), work(x.size());
  sparsemax_forward_row<double, double>(x.data(), p.data(), static_cast<int64_t>(x.size()), work.data());
  return p;
}

// Textbook sparsemax (Martins & Astudillo, Alg. 1): sort, find the support size by cumsum.
std::vector<double> sparsemax_by_sorting(const std::vector<double>& x) {
  std::vector<double> z(x);
  std::sort(z.begin(), z.end(), std::greater<>());
  double cumsum = 0, tau = 0;
  for (size_t k = 1; k <= z.size(); ++k) {
    cumsum += z[k - 1];
    if (1 + k * z[k - 1] > cumsum) tau = (cumsum - 1) / k;
  }
  std::vector<double> p(x.size());
  for (size_t i = 0; i < x.size(); ++i) p[i] = std::max(x[i] - tau, 0.0);
  return p;
}

TEST_CASE(known_rows) {
  const std::vector<double> p = sparsemax_of({1.0, 0.5, 0.0});
  EXPECT_NEAR(p[0], 0.75, 1e-15);
  EXPECT_NEAR(p[1], 0.25, 1e-15);
  EXPECT(p[2] == 0.0);
  for (double v : sparsemax_of({2.0, 2.0, 2.0, 2.0})) EXPECT_NEAR(v, 0.25, 1e-15);
  EXPECT(sparsemax_of({-7.0})[0] == 1.0);
}

TEST_CASE(special_rows) {
  const std::vector<double> with_inf = sparsemax_of({kInf, 3.0, kInf});
  EXPECT(with_inf[0] == 0.5 && with_inf[1] == 0.0 && with_inf[2] == 0.5);
  const std::vector<double> with_neg_inf = sparsemax_of({-kInf, 1.0, -kInf});
  EXPECT(with_neg_inf[0] == 0.0 && with_neg_inf[1] == 1.0);
  for (double v : sparsemax_of({-kInf, -kInf})) EXPECT(std::isnan(v));
  for (double v : sparsemax_of({std::nan(""), 1.0})) EXPECT(std::isnan(v));
  const std::vector<double> huge = sparsemax_of({1e300, -1e300, 1e300});
  EXPECT(huge[0] == 0.5 && huge[1] == 0.0);
}

TEST_CASE(matches_sort_based_solver) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 2.0);
  for (int n : {1, 2, 3, 5, 20, 64, 257, 1000}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<double> x(n);
      for (double& v : x) v = normal(rng);
      const std::vector<double> p = sparsemax_of(x), expected = sparsemax_by_sorting(x);
      for (int i = 0; i < n; ++i) EXPECT_NEAR(p[i], expected[i], 1e-12);
      EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
    }
  }
}

TEST_CASE(backward_centres_the_gradient_on_the_support) {
  const std::vector<double> p = {0.5, 0.0, 0.5, 0.0}, g = {1.0, 5.0, 3.0, -2.0};
  std::vector<double> grad_x(4);
  sparsemax_backward_row<double, double>(p.data(), g.data(), grad_x.data(), 4);
  EXPECT(grad_x[0] == -1.0 && grad_x[1] == 0.0 && grad_x[2] == 1.0 && grad_x[3] == 0.0);
}

TEST_CASE(torch_entry_points) {
  const at::Tensor x = at::randn({300, 37});
  const at::Tensor p = sopfast::sparsemax_forward<c10::kCPU>(x);
  EXPECT(p.sizes() == x.sizes() && p.scalar_type() == at::kFloat);
  EXPECT(at::allclose(p.sum(1), at::ones({300}), 0, 1e-5));
  const at::Tensor x_half = x.to(at::kHalf);
  const at::Tensor p_half = sopfast::sparsemax_forward<c10::kCPU>(x_half);
  EXPECT(p_half.scalar_type() == at::kHalf);
  EXPECT(at::allclose(p_half.to(at::kFloat), sopfast::sparsemax_forward<c10::kCPU>(x_half.to(at::kFloat)), 0, 1e-3));
  const at::Tensor p_double = sopfast::sparsemax_forward<c10::kCPU>(x.to(at::kDouble));
  EXPECT(at::allclose(p_double.to(at::kFloat), p, 0, 1e-6));
  const at::Tensor grad_x = sopfast::sparsemax_backward<c10::kCPU>(p, at::randn({300, 37}));
  EXPECT(at::allclose(grad_x.sum(1), at::zeros({300}), 0, 1e-5));
  EXPECT(sopfast::sparsemax_forward<c10::kCPU>(at::randn({0, 5})).numel() == 0);
}

TEST_CASE(torch_entry_points_reject_bad_inputs) {
  EXPECT_THROWS(sopfast::sparsemax_forward<c10::kCPU>(at::randn({2, 3, 4})));
  EXPECT_THROWS(sopfast::sparsemax_forward<c10::kCPU>(at::randn({2, 3}).to(at::kInt)));
  EXPECT_THROWS(sopfast::sparsemax_backward<c10::kCPU>(at::randn({2, 3}), at::randn({3, 2})));
  EXPECT_THROWS(sopfast::sparsemax_backward<c10::kCPU>(at::randn({2, 3}), at::randn({2, 3}).to(at::kDouble)));
  EXPECT_THROWS_WITH(sopfast::sparsemax_backward<c10::kCPU>(at::randn({2, 3}), at::randn({2, 3}, at::kMeta)),
                     c10::ValueError, "grad is on meta but p is on cpu");
  EXPECT_THROWS_WITH(sopfast::sparsemax_forward<c10::kCPU>(at::ones({2, 3}, at::kInt)), c10::TypeError,
                     "x must be float32, float16, bfloat16 or float64, got Int");
}

}  // namespace

TEST_MAIN()
