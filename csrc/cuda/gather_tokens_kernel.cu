// CUDA gather_tokens: x[B, T, E] -> out[B*m, prefix + k, E] as a vectorised copy (the widest
// word, up to 16 bytes, that divides a row and the alignment), and its backward as a
// deterministic gather-form scatter-add: one block per (b, t) sums, in a fixed order, the
// gradient rows of every (group, slot) that picked token t.
#include "cuda/cuda_common.cuh"

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

template <typename scalar_t>
__global__ void __launch_bounds__(kSumThreads)
    gather_tokens_backward_kernel(const scalar_t* __restrict__ grad, const int64_t* __restrict__ indices,
                                  scalar_t* __restrict__ grad_x, GatherTokensShape dims) {
  using acc_t = typename AccType<scalar_t>::type;
  const int64_t slots = dims.prefix + dims.keep, e = dims.embed;
  for (int64_t bt = blockIdx.x; bt < dims.batch * dims.tokens; bt += gridDim.x) {
    const int64_t b = bt / dims.tokens, t = bt % dims.tokens;
    for (int64_t e0 = 0; e0 < e; e0 += int64_t(kSumThreads) * kSumValues) {
      acc_t acc[kSumValues] = {};
      for (int64_t i = 0; i < dims.groups; ++i) {
        const int64_t group_row = b * dims.groups + i;
        for (int64_t slot = 0; slot < slots; ++slot) {
          if (source_token(dims, indices, group_row, slot) != t) continue;  // uniform over the block
          const scalar_t* src = grad + (group_row * slots + slot) * e;
#pragma unroll
          for (int v = 0; v < kSumValues; ++v) {
            const int64_t c = e0 + int64_t(v) * kSumThreads + threadIdx.x;
            if (c < e) acc[v] += load_as<acc_t>(src + c);
          }
        }
      }
#pragma unroll
      for (int v = 0; v < kSumValues; ++v) {
        const int64_t c = e0 + int64_t(v) * kSumThreads + threadIdx.x;
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

int gather_tokens_backward_launch(const void* grad, const int64_t* indices, void* grad_x, const GatherTokensShape& dims,
                                  FloatType dtype, void* stream) {
  if (dims.batch * dims.tokens * dims.embed == 0) return 0;
  return dispatch_float_type(dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    gather_tokens_backward_kernel<scalar_t>
        <<<grid_for(dims.batch * dims.tokens, 1), kSumThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const scalar_t*>(grad), indices, static_cast<scalar_t*>(grad_x), dims);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace sopfast::cuda
