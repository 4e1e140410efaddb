// Unit tests of the gather_tokens CPU kernels: forward rows and the backward blocks against
// naive loops, and the torch entry points.
#include <ATen/ATen.h>

#include <random>
#include <vector>

#include "cpu/gather_tokens_kernels.h"
#include "ops.h"
#include "tests/harness.h"

namespace {

using sopfast::GatherTokensShape;

GatherTokensShape small_shape() {
  GatherTokensShape sh;
  sh.batch = 2;
  sh.tokens = 7;
  sh.embed = 5;
  sh.groups = 3;
  sh.keep = 4;
  sh.prefix = 2;
  return sh;
}

std::vector<int64_t> random_indices(const GatherTokensShape& sh, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> token(-1, sh.tokens - 1);
  std::vector<int64_t> indices(sh.batch * sh.groups * sh.keep);
  for (int64_t& i : indices) i = token(rng);
  return indices;
}

TEST_CASE(forward_rows_copy_prefix_tokens_and_zero_padding) {
  const GatherTokensShape sh = small_shape();
  std::vector<float> x(sh.batch * sh.tokens * sh.embed);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  const std::vector<int64_t> indices = random_indices(sh, 1);
  const int64_t rows = sh.batch * sh.groups * sh.slots();
  std::vector<float> out(rows * sh.embed, -1.0f);
  sopfast::cpu::gather_tokens_forward_rows(sh, x.data(), indices.data(), out.data(), 0, rows);
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t i = 0; i < sh.groups; ++i) {
      for (int64_t slot = 0; slot < sh.slots(); ++slot) {
        const int64_t token = slot < sh.prefix ? slot : indices[(b * sh.groups + i) * sh.keep + slot - sh.prefix];
        for (int64_t e = 0; e < sh.embed; ++e) {
          const float got = out[((b * sh.groups + i) * sh.slots() + slot) * sh.embed + e];
          EXPECT(got == (token < 0 ? 0.0f : x[(b * sh.tokens + token) * sh.embed + e]));
        }
      }
    }
  }
}

template <typename scalar_t>
void check_backward_against_naive_sum(int64_t column_blocks) {
  const GatherTokensShape sh = small_shape();
  const std::vector<int64_t> indices = random_indices(sh, 2);
  std::vector<scalar_t> grad(sh.batch * sh.groups * sh.slots() * sh.embed);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = scalar_t((i * 7) % 13) / scalar_t(4);
  std::vector<double> expected(sh.batch * sh.tokens * sh.embed, 0.0);
  for (int64_t r = 0; r < sh.batch * sh.groups * sh.slots(); ++r) {
    const int64_t group_row = r / sh.slots(), slot = r % sh.slots();
    const int64_t token = sopfast::cpu::gather_tokens_source(sh, indices.data(), group_row, slot);
    if (token < 0) continue;
    for (int64_t e = 0; e < sh.embed; ++e) {
      expected[(group_row / sh.groups * sh.tokens + token) * sh.embed + e] += double(grad[r * sh.embed + e]);
    }
  }
  std::vector<scalar_t> grad_x(expected.size(), scalar_t(-7));
  const int64_t width = (sh.embed + column_blocks - 1) / column_blocks;
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t e0 = 0; e0 < sh.embed; e0 += width) {
      sopfast::cpu::gather_tokens_backward_block<scalar_t, float>(sh, grad.data(), indices.data(), grad_x.data(), b, e0,
                                                                  std::min(sh.embed, e0 + width));
    }
  }
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(grad_x[i], expected[i], 1e-5);
}

TEST_CASE(backward_blocks_sum_every_use_of_a_token) {
  check_backward_against_naive_sum<float>(1);
  check_backward_against_naive_sum<float>(2);
  check_backward_against_naive_sum<double>(3);
}

TEST_CASE(torch_entry_points) {
  const at::Tensor x = at::randn({4, 197, 64});
  const at::Tensor indices = at::randint(1, 197, {4, 5, 39}, at::kLong);  // never the prefix token
  const at::Tensor out = sopfast::gather_tokens_forward<c10::kCPU>(x, indices, 1);
  EXPECT(out.sizes() == at::IntArrayRef({20, 40, 64}));
  EXPECT(out.select(1, 0).equal(x.select(1, 0).repeat_interleave(5, 0)));
  const at::Tensor grad_x =
      sopfast::gather_tokens_backward<c10::kCPU>(at::ones({20, 40, 64}, at::kBFloat16), indices, 1, 197);
  EXPECT(grad_x.scalar_type() == at::kBFloat16 && grad_x.sizes() == x.sizes());
  EXPECT(grad_x[0][0][0].item<float>() == 5.0f);  // the prefix token, once per group
}

TEST_CASE(torch_entry_points_reject_bad_inputs) {
  const at::Tensor x = at::randn({2, 5, 3});
  EXPECT_THROWS(sopfast::gather_tokens_forward<c10::kCPU>(x, at::full({2, 1, 1}, 5, at::kLong), 0));
  EXPECT_THROWS(sopfast::gather_tokens_forward<c10::kCPU>(x, at::full({2, 1, 1}, -2, at::kLong), 0));
  EXPECT_THROWS(sopfast::gather_tokens_forward<c10::kCPU>(x, at::zeros({3, 1, 1}, at::kLong), 0));
  EXPECT_THROWS(sopfast::gather_tokens_forward<c10::kCPU>(x, at::zeros({2, 1, 1}, at::kInt), 0));
  EXPECT_THROWS(sopfast::gather_tokens_forward<c10::kCPU>(x, at::zeros({2, 1, 1}, at::kLong), 6));
  EXPECT_THROWS(
      sopfast::gather_tokens_backward<c10::kCPU>(at::randn({2, 3, 4}), at::zeros({2, 1, 2}, at::kLong), 0, 5));
  EXPECT_THROWS_WITH(sopfast::gather_tokens_forward<c10::kCPU>(x, at::full({2, 1, 1}, 5, at::kLong), 0),
                     c10::ValueError, "indices must lie in [0, T=5) or be -1 (padding), got 5");
  const auto meta = at::TensorOptions().dtype(at::kLong).device(at::kMeta);
  EXPECT_THROWS_WITH(sopfast::gather_tokens_forward<c10::kCPU>(x, at::zeros({2, 1, 1}, meta), 0), c10::ValueError,
                     "indices is on meta but x is on cpu");
  EXPECT_THROWS_WITH(sopfast::gather_tokens_backward<c10::kCPU>(at::randn({2, 1, 3}), at::zeros({2, 1, 1}, meta), 0, 5),
                     c10::ValueError, "indices is on meta but grad is on cpu");
  EXPECT_THROWS_WITH(
      sopfast::gather_tokens_backward<c10::kCPU>(at::randn({2, 1, 3}), at::full({2, 1, 1}, 5, at::kLong), 0, 5),
      c10::ValueError, "indices must lie in [0, T=5)");
}

}  // namespace

TEST_MAIN()
