// CUDA gather_tokens: x[B, T, E] -> out[B*m, prefix + k, E] as a vectorised copy (the widest
// word, up to 16 bytes, that divides a row and the alignment), and its backward as a
// deterministic gather-form scatter-add through an inverted index (csrc/team_rows.h): count the
// entries per (b, t) -> per-batch scan into offsets -> a stable fill (one warp per batch element,
// entries in order, equal tokens ranked by __match_any_sync) -> one block per (b, t) sums the
// gradient rows of its prefix slots and of its entries, in that fixed order.  Each gradient row is
// read once: the memory floor, where scanning every index per token read m * (p + k) per token.
#include "cuda/cuda_common.cuh"
#include "team_rows.h"

namespace sopfast::cuda {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kSumThreads = 128;  // threads per (b, t) block of the backward
constexpr int kSumValues = 8;     // embedding columns per thread and pass of the backward

// Token copied into output slot `slot` of group row `group_row` (= b * m + i); < 0: zero row.
__device__ __forceinline__ int64_t source_token(const GatherTokensShape& dims, const int64_t* indices,
                                                int64_t group_row, int64_t slot) {
  if (slot < dims.prefix) return slot;
  const int64_t token = indices[group_row * dims.keep + (slot - dims.prefix)];
  return token < dims.tokens ? token : -1;  // out-of-range indices are treated as padding
}

template <typename Word>
__global__ void gather_tokens_forward_kernel(const Word* __restrict__ x, const int64_t* __restrict__ indices,
                                             Word* __restrict__ out, GatherTokensShape dims, int64_t row_words) {
  const int64_t slots = dims.prefix + dims.keep;
  const int64_t total = dims.batch * dims.groups * slots * row_words;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < total; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = w / row_words, col = w % row_words;
    const int64_t group_row = row / slots;
    const int64_t token = source_token(dims, indices, group_row, row % slots);
    const int64_t b = group_row / dims.groups;
    out[w] = token < 0 ? Word{} : x[(b * dims.tokens + token) * row_words + col];
  }
}

// Entries per (b, t) of the body indices into counts[B * T] (zeroed).
__global__ void gather_csr_count_kernel(const int64_t* __restrict__ indices, GatherTokensShape sh,
                                        unsigned long long* __restrict__ counts) {
  const int64_t body = sh.groups * sh.keep, total = sh.batch * body;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = indices[e];
    if (token >= 0 && token < sh.tokens) atomicAdd(counts + (e / body) * sh.tokens + token, 1ull);
  }
}

// One warp per batch element b: offsets[b, t] = b * body + (entries of tokens < t), and cursor[b, t]
// (the counts, overwritten) = offsets[b, t], the next free position of token t.
__global__ void gather_csr_offsets_kernel(GatherTokensShape sh, int64_t* __restrict__ offsets,
                                          int64_t* __restrict__ cursor) {
  const int lane = threadIdx.x % kWarp;
  const int64_t body = sh.groups * sh.keep;
  const int64_t per_lane = (sh.tokens + kWarp - 1) / kWarp;
  for (int64_t b = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; b < sh.batch;
       b += int64_t(gridDim.x) * (blockDim.x / kWarp)) {
    int64_t* counts = cursor + b * sh.tokens;
    int64_t* segment = offsets + b * (sh.tokens + 1);
    const int64_t first = lane * per_lane, last = min(sh.tokens, first + per_lane);
    int64_t mine = 0;
    for (int64_t t = first; t < last; ++t) mine += counts[t];
    int64_t before = mine;  // inclusive scan over the lanes, then exclusive
#pragma unroll
    for (int offset = 1; offset < kWarp; offset *= 2) {
      const int64_t other = __shfl_up_sync(kFullMask, before, offset);
      if (lane >= offset) before += other;
    }
    int64_t position = b * body + before - mine;
    for (int64_t t = first; t < last; ++t) {
      const int64_t count = counts[t];
      segment[t] = position;
      counts[t] = position;
      position += count;
    }
    if (lane == kWarp - 1) segment[sh.tokens] = position;
  }
}

// One warp per batch element b: entries in order, 32 at a time; the lanes holding one token rank
// themselves by lane (__match_any_sync), so each segment lists its entries in increasing order.
__global__ void gather_csr_fill_kernel(const int64_t* __restrict__ indices, GatherTokensShape sh,
                                       int64_t* __restrict__ cursor, int64_t* __restrict__ entries) {
  const int lane = threadIdx.x % kWarp;
  const unsigned lower = (1u << lane) - 1u;
  const int64_t body = sh.groups * sh.keep;
  for (int64_t b = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; b < sh.batch;
       b += int64_t(gridDim.x) * (blockDim.x / kWarp)) {
    for (int64_t e0 = 0; e0 < body; e0 += kWarp) {
      const int64_t e = e0 + lane;
      const int64_t token = e < body ? indices[b * body + e] : -1;
      const bool real = token >= 0 && token < sh.tokens;
      const unsigned long long key = real ? static_cast<unsigned long long>(token) : ~0ull - lane;
      const unsigned peers = __match_any_sync(kFullMask, key);
      int64_t* next = cursor + b * sh.tokens + (real ? token : 0);
      const int64_t position = real ? *next + __popc(peers & lower) : 0;
      __syncwarp();
      if (real) {
        entries[position] = e;
        if ((peers & lower) == 0) *next += __popc(peers);  // the lowest lane of the token moves its cursor
      }
      __syncwarp();
    }
  }
}

// One block per (b, t): grad_x[b, t] from the prefix slots and the entries of its segment.
template <typename scalar_t>
__global__ void __launch_bounds__(kSumThreads)
    gather_tokens_backward_kernel(const scalar_t* __restrict__ grad, const int64_t* __restrict__ offsets,
                                  const int64_t* __restrict__ entries, scalar_t* __restrict__ grad_x,
                                  GatherTokensShape sh) {
  using acc_t = typename AccType<scalar_t>::type;
  const int64_t e = sh.embed;
  auto load = [grad, e](int64_t row, int64_t c) { return c < e ? load_as<acc_t>(grad + row * e + c) : acc_t(0); };
  for (int64_t bt = blockIdx.x; bt < sh.batch * sh.tokens; bt += gridDim.x) {
    const int64_t b = bt / sh.tokens, t = bt % sh.tokens;
    for (int64_t e0 = 0; e0 < e; e0 += int64_t(kSumThreads) * kSumValues) {
      const int64_t c0 = e0 + threadIdx.x;
      acc_t acc[kSumValues];
      gather_tokens_backward_token(sh, offsets, entries, b, t, c0, kSumValues, kSumThreads, load, acc);
#pragma unroll
      for (int v = 0; v < kSumValues; ++v) {
        const int64_t c = c0 + int64_t(v) * kSumThreads;
        if (c < e) grad_x[bt * e + c] = cast_to<scalar_t>(acc[v]);
      }
    }
  }
}

template <typename Word>
void launch_gather_tokens_forward(const void* x, const int64_t* indices, void* out, const GatherTokensShape& dims,
                                  int64_t row_bytes, cudaStream_t stream) {
  const int64_t row_words = row_bytes / int64_t(sizeof(Word));
  const int64_t total = dims.batch * dims.groups * (dims.prefix + dims.keep) * row_words;
  gather_tokens_forward_kernel<Word><<<grid_for(total, kCopyThreads), kCopyThreads, 0, stream>>>(
      static_cast<const Word*>(x), indices, static_cast<Word*>(out), dims, row_words);
}

// The widest of 16, 8, 4, 2 bytes dividing the row size and both base addresses.
int64_t copy_word_bytes(const void* x, const void* out, int64_t row_bytes) {
  const auto bits =
      static_cast<uint64_t>(row_bytes) | reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out);
  for (int64_t word = 16; word > 2; word /= 2) {
    if (bits % static_cast<uint64_t>(word) == 0) return word;
  }
  return 2;
}

size_t float_type_bytes(FloatType dtype) {
  return dtype == FloatType::kFloat64 ? 8 : (dtype == FloatType::kFloat32 ? 4 : 2);
}

}  // namespace

int gather_tokens_forward_launch(const void* x, const int64_t* indices, void* out, const GatherTokensShape& dims,
                                 FloatType dtype, void* stream) {
  if (dims.batch * dims.groups * (dims.prefix + dims.keep) * dims.embed == 0) return 0;
  const int64_t row_bytes = dims.embed * static_cast<int64_t>(float_type_bytes(dtype));
  auto s = static_cast<cudaStream_t>(stream);
  switch (copy_word_bytes(x, out, row_bytes)) {
    case 16:
      launch_gather_tokens_forward<uint4>(x, indices, out, dims, row_bytes, s);
      break;
    case 8:
      launch_gather_tokens_forward<uint2>(x, indices, out, dims, row_bytes, s);
      break;
    case 4:
      launch_gather_tokens_forward<uint32_t>(x, indices, out, dims, row_bytes, s);
      break;
    default:
      launch_gather_tokens_forward<uint16_t>(x, indices, out, dims, row_bytes, s);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

int64_t gather_tokens_backward_workspace(const GatherTokensShape& dims) {
  return dims.batch * (dims.tokens + 1) + dims.batch * dims.tokens + dims.batch * dims.groups * dims.keep;
}

int gather_tokens_backward_launch(const void* grad, const int64_t* indices, void* grad_x, const GatherTokensShape& dims,
                                  FloatType dtype, int64_t* workspace, void* stream) {
  if (dims.batch * dims.tokens * dims.embed == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  int64_t* offsets = workspace;
  int64_t* cursor = offsets + dims.batch * (dims.tokens + 1);
  int64_t* entries = cursor + dims.batch * dims.tokens;
  const int64_t body = dims.batch * dims.groups * dims.keep;
  int code = static_cast<int>(cudaMemsetAsync(cursor, 0, sizeof(int64_t) * dims.batch * dims.tokens, s));
  if (code != 0) return code;
  if (body > 0) {
    gather_csr_count_kernel<<<grid_for(body, kCopyThreads), kCopyThreads, 0, s>>>(
        indices, dims, reinterpret_cast<unsigned long long*>(cursor));
  }
  constexpr int warps = kCopyThreads / kWarp;
  gather_csr_offsets_kernel<<<grid_for(dims.batch, warps), kCopyThreads, 0, s>>>(dims, offsets, cursor);
  if (body > 0) {
    gather_csr_fill_kernel<<<grid_for(dims.batch, warps), kCopyThreads, 0, s>>>(indices, dims, cursor, entries);
  }
  return dispatch_float_type(dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    gather_tokens_backward_kernel<scalar_t><<<grid_for(dims.batch * dims.tokens, 1), kSumThreads, 0, s>>>(
        static_cast<const scalar_t*>(grad), offsets, entries, static_cast<scalar_t*>(grad_x), dims);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace sopfast::cuda
