// Raw-pointer CPU kernels of gather_tokens: x[B, T, E] -> out[B*m, prefix + k, E] and its
// scatter-add backward (no torch dependency).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "sopfast_common.h"

namespace sopfast::cpu {

// Source token of output slot `slot` of group row `group_row` (= b * m + i); -1 is padding.
inline int64_t gather_tokens_source(const GatherTokensShape& sh, const int64_t* indices, int64_t group_row,
                                    int64_t slot) {
  return slot < sh.prefix ? slot : indices[group_row * sh.keep + (slot - sh.prefix)];
}

// Output rows [begin, end) of the flattened out[B*m*(prefix + k), E]: one memcpy (or memset
// for padding) per row.  Indices must lie in [-1, T).
template <typename scalar_t>
void gather_tokens_forward_rows(const GatherTokensShape& sh, const scalar_t* x, const int64_t* indices, scalar_t* out,
                                int64_t begin, int64_t end) {
  const int64_t e = sh.embed;
  const size_t row_bytes = static_cast<size_t>(e) * sizeof(scalar_t);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t group_row = r / sh.slots();
    const int64_t token = gather_tokens_source(sh, indices, group_row, r % sh.slots());
    scalar_t* dst = out + r * e;
    if (token < 0) {
      std::memset(static_cast<void*>(dst), 0, row_bytes);
    } else {
      const int64_t b = group_row / sh.groups;
      std::memcpy(static_cast<void*>(dst), static_cast<const void*>(x + (b * sh.tokens + token) * e), row_bytes);
    }
  }
}

// acc[t, c] (row stride acc_stride, zero on entry) += the gradient of batch element b for
// embedding columns [e_begin, e_end): sum over groups and slots of grad[b*m + i, slot, e].
template <typename scalar_t, typename acc_t>
void gather_tokens_accumulate(const GatherTokensShape& sh, const scalar_t* grad, const int64_t* indices, int64_t b,
                              int64_t e_begin, int64_t e_end, acc_t* acc, int64_t acc_stride) {
  const int64_t width = e_end - e_begin;
  for (int64_t i = 0; i < sh.groups; ++i) {
    const int64_t group_row = b * sh.groups + i;
    for (int64_t slot = 0; slot < sh.slots(); ++slot) {
      const int64_t token = gather_tokens_source(sh, indices, group_row, slot);
      if (token < 0) continue;
      const scalar_t* src = grad + (group_row * sh.slots() + slot) * sh.embed + e_begin;
      acc_t* dst = acc + token * acc_stride;
      for (int64_t c = 0; c < width; ++c) dst[c] += static_cast<acc_t>(src[c]);
    }
  }
}

// Backward for batch element b and columns [e_begin, e_end): grad_x[b, :, e_begin:e_end].
// acc_t accumulators: straight into grad_x when scalar_t is acc_t, else into a [T, width] buffer.
template <typename scalar_t, typename acc_t>
void gather_tokens_backward_block(const GatherTokensShape& sh, const scalar_t* grad, const int64_t* indices,
                                  scalar_t* grad_x, int64_t b, int64_t e_begin, int64_t e_end) {
  const int64_t width = e_end - e_begin;
  scalar_t* out = grad_x + b * sh.tokens * sh.embed + e_begin;
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    for (int64_t t = 0; t < sh.tokens; ++t) std::fill(out + t * sh.embed, out + t * sh.embed + width, acc_t(0));
    gather_tokens_accumulate<scalar_t, acc_t>(sh, grad, indices, b, e_begin, e_end, out, sh.embed);
  } else {
    std::vector<acc_t> acc(static_cast<size_t>(sh.tokens * width), acc_t(0));
    gather_tokens_accumulate<scalar_t, acc_t>(sh, grad, indices, b, e_begin, e_end, acc.data(), width);
    for (int64_t t = 0; t < sh.tokens; ++t) {
      for (int64_t c = 0; c < width; ++c) out[t * sh.embed + c] = static_cast<scalar_t>(acc[t * width + c]);
    }
  }
}

}  // namespace sopfast::cpu
