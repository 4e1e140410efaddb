// CUDA top_tau: one block per row.  Blur (reflect padding) -> softmax over the valid
// features -> rank of each feature by counting the keys that beat it (valid first, then by
// logit, ties to the lower index: sopfast::top_tau_key) -> mask, lam, ascending indices.
// Backward: the closed form of python/sopfast/ops/top_tau.py, then the blur's transpose in
// gather form (deterministic).  Math in float32 (float64 for double logits).
#include "cuda/cuda_common.cuh"

namespace sopfast::cuda {
namespace {

constexpr int kThreads = 256;           // threads per block (= per row)
constexpr int kKeyTile = 4 * kThreads;  // keys staged in shared memory per round of the rank count

template <typename acc_t>
struct BlurParams {
  const acc_t* kernel;  // [size] or nullptr
  int64_t size, grid_h, grid_w;

  __device__ bool on() const { return kernel != nullptr && size > 0; }
  __device__ bool two_d() const { return grid_h > 0 && grid_w > 0; }
};

// out = sum_t kernel[t] * in(reflect(pos + t - pad)) along one axis of length len; in(q) loads position q.
template <typename acc_t, typename Load>
__device__ acc_t blur_at(const BlurParams<acc_t>& blur, int64_t pos, int64_t len, Load in) {
  const int64_t pad = blur.size / 2;
  acc_t acc = 0;
  for (int64_t t = 0; t < blur.size; ++t) acc += mul_rn(blur.kernel[t], in(reflect_index(pos + t - pad, len)));
  return acc;
}

// Transpose of blur_at at position pos: sum of kernel[t] * g(j) over all (j, t) with
// reflect(j + t - pad) == pos, i.e. j + t - pad is pos or one of its reflected images.
template <typename acc_t, typename Load>
__device__ acc_t blur_adjoint_at(const BlurParams<acc_t>& blur, int64_t pos, int64_t len, Load g) {
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

template <typename scalar_t, typename acc_t>
struct ForwardParams {
  const scalar_t* logits;
  const bool* valid;
  const int64_t* k;
  int64_t rows, d, k_max;
  bool largest;
  BlurParams<acc_t> blur;
  acc_t* scratch;
  int64_t* indices;
  bool* mask;
  acc_t* lam;
  acc_t* attention;
};

// Blurs row `row` of the logits into scratch (2-D: along w into the attention row, free until
// the softmax, then along h into scratch); returns the blurred row.  Ends with a block barrier.
template <typename scalar_t, typename acc_t>
__device__ const acc_t* blur_logits_row(const ForwardParams<scalar_t, acc_t>& p, int64_t row) {
  const int64_t d = p.d;
  const scalar_t* logits = p.logits + row * d;
  acc_t* s = p.scratch + row * d;
  auto load_logit = [&](int64_t q) { return load_as<acc_t>(logits + q); };
  if (p.blur.two_d()) {
    const int64_t h = p.blur.grid_h, w = p.blur.grid_w;
    acc_t* tmp = p.attention + row * d;
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const int64_t r = j / w, c = j % w;
      tmp[j] = blur_at(p.blur, c, w, [&](int64_t q) { return load_logit(r * w + q); });
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const int64_t r = j / w, c = j % w;
      s[j] = blur_at(p.blur, r, h, [&](int64_t q) { return tmp[q * w + c]; });
    }
  } else {
    for (int64_t j = threadIdx.x; j < d; j += kThreads) s[j] = blur_at(p.blur, j, d, load_logit);
  }
  __syncthreads();
  return s;
}

template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads) top_tau_forward_kernel(ForwardParams<scalar_t, acc_t> p) {
  using key_t = typename TopTauKeyType<acc_t>::type;
  __shared__ key_t keys[kKeyTile];
  const int64_t d = p.d;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const acc_t* blurred = p.blur.on() ? blur_logits_row(p, row) : nullptr;
    const scalar_t* logits = p.logits + row * d;
    const bool* valid = p.valid == nullptr ? nullptr : p.valid + row * d;
    auto s_at = [&](int64_t j) { return blurred != nullptr ? blurred[j] : load_as<acc_t>(logits + j); };
    auto valid_at = [&](int64_t j) { return valid == nullptr || valid[j]; };

    // softmax statistics over the valid features
    acc_t row_max = -infinity<acc_t>();
    int n_posinf = 0, has_nan = 0;
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      if (!valid_at(j)) continue;
      const acc_t v = s_at(j);
      row_max = fmax(row_max, v);
      n_posinf += v == infinity<acc_t>();
      has_nan |= v != v;
    }
    row_max = block_allreduce<kThreads>(row_max, MaxOp{});
    n_posinf = block_allreduce<kThreads>(n_posinf, SumOp{});
    has_nan = block_allreduce<kThreads>(has_nan, SumOp{});
    const bool nan_row = n_posinf == 0 && (has_nan || row_max == -infinity<acc_t>());
    acc_t sum = 0;
    if (n_posinf == 0 && !nan_row) {
      for (int64_t j = threadIdx.x; j < d; j += kThreads) sum += valid_at(j) ? exp(s_at(j) - row_max) : acc_t(0);
    }
    const acc_t inv_sum = acc_t(1) / block_allreduce<kThreads>(sum, SumOp{});
    auto attention_at = [&](int64_t j) -> acc_t {
      if (nan_row) return quiet_nan<acc_t>();
      if (!valid_at(j)) return acc_t(0);
      const acc_t v = s_at(j);
      if (n_posinf > 0) return v == infinity<acc_t>() ? acc_t(1) / acc_t(n_posinf) : acc_t(0);
      return exp(v - row_max) * inv_sum;
    };

    // rank by counting: feature j is kept when fewer than k keys beat its key
    const int64_t kk = min(max(p.k[row], int64_t(0)), d);
    acc_t kept = 0;
    for (int64_t j0 = 0; j0 < d; j0 += kThreads) {
      const int64_t j = j0 + threadIdx.x;
      const key_t key_j = j < d ? top_tau_key(s_at(j), valid_at(j), p.largest, j, false) : key_t(0);
      int64_t beaten_by = 0;
      for (int64_t i0 = 0; i0 < d; i0 += kKeyTile) {
        const int64_t tile = min(int64_t(kKeyTile), d - i0);
        __syncthreads();
        for (int64_t i = threadIdx.x; i < tile; i += kThreads) {
          keys[i] = top_tau_key(s_at(i0 + i), valid_at(i0 + i), p.largest, i0 + i, false);
        }
        __syncthreads();
        for (int64_t i = 0; i < tile; ++i) beaten_by += keys[i] > key_j;
      }
      if (j < d) {
        const bool in_group = beaten_by < kk;
        const acc_t a = attention_at(j);
        p.mask[row * d + j] = in_group;
        kept += in_group ? a : acc_t(0);
        p.attention[row * d + j] = a;
      }
    }
    kept = block_allreduce<kThreads>(kept, SumOp{});  // also orders the mask writes before the reads below
    if (threadIdx.x == 0) p.lam[row] = 2 * kept - 1;

    // ascending indices of the mask, -1 padded
    int64_t count = 0;
    for (int64_t j0 = 0; j0 < d && count < p.k_max; j0 += kThreads) {
      const int64_t j = j0 + threadIdx.x;
      const bool flag = j < d && p.mask[row * d + j];
      int tile_total;
      const int64_t pos = count + block_exclusive_count<kThreads>(flag, &tile_total);
      if (flag && pos < p.k_max) p.indices[row * p.k_max + pos] = j;
      count += tile_total;
    }
    for (int64_t pos = count + threadIdx.x; pos < p.k_max; pos += kThreads) p.indices[row * p.k_max + pos] = -1;
    __syncthreads();
  }
}

template <typename acc_t>
struct BackwardParams {
  const acc_t* attention;
  const bool* mask;
  const acc_t* lam;
  const acc_t* grad_lam;
  const acc_t* grad_attention;
  int64_t rows, d;
  BlurParams<acc_t> blur;
  acc_t* scratch;
  acc_t* grad_logits;
};

template <typename acc_t>
__global__ void __launch_bounds__(kThreads) top_tau_backward_kernel(BackwardParams<acc_t> p) {
  const int64_t d = p.d;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const acc_t* a = p.attention + row * d;
    const acc_t* ga = p.grad_attention == nullptr ? nullptr : p.grad_attention + row * d;
    acc_t dot = 0;
    if (ga != nullptr) {
      for (int64_t j = threadIdx.x; j < d; j += kThreads) dot += a[j] * ga[j];
      dot = block_allreduce<kThreads>(dot, SumOp{});
    }
    const acc_t lam = p.lam[row], grad_lam = p.grad_lam[row];
    // without a blur g goes straight out; 1-D blur: g -> scratch; 2-D: g -> out -> scratch -> out
    acc_t* out = p.grad_logits + row * d;
    acc_t* scratch = p.scratch == nullptr ? nullptr : p.scratch + row * d;
    acc_t* g = p.blur.on() && !p.blur.two_d() ? scratch : out;
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const acc_t sign = p.mask[row * d + j] ? acc_t(1) : acc_t(-1);
      acc_t v = a[j] * (grad_lam * (sign - lam));
      if (ga != nullptr) v += a[j] * (ga[j] - dot);
      g[j] = v;
    }
    if (p.blur.on()) {
      __syncthreads();
      if (p.blur.two_d()) {
        const int64_t h = p.blur.grid_h, w = p.blur.grid_w;
        for (int64_t j = threadIdx.x; j < d; j += kThreads) {
          const int64_t r = j / w, c = j % w;
          scratch[j] = blur_adjoint_at(p.blur, r, h, [&](int64_t q) { return g[q * w + c]; });
        }
        __syncthreads();
        for (int64_t j = threadIdx.x; j < d; j += kThreads) {
          const int64_t r = j / w, c = j % w;
          out[j] = blur_adjoint_at(p.blur, c, w, [&](int64_t q) { return scratch[r * w + q]; });
        }
      } else {
        for (int64_t j = threadIdx.x; j < d; j += kThreads) {
          out[j] = blur_adjoint_at(p.blur, j, d, [&](int64_t q) { return scratch[q]; });
        }
      }
    }
    __syncthreads();
  }
}

template <typename acc_t>
BlurParams<acc_t> blur_params(const void* kernel, int64_t size, int64_t grid_h, int64_t grid_w) {
  return {static_cast<const acc_t*>(kernel), kernel == nullptr ? 0 : size, grid_h, grid_w};
}

}  // namespace

int top_tau_forward_launch(const TopTauForwardArgs& args, void* stream) {
  if (args.rows == 0) return 0;
  if (args.blur_kernel != nullptr && args.scratch == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  return dispatch_float_type(args.logits_type, [&](auto tag) {
    using scalar_t = decltype(tag);
    using acc_t = typename AccType<scalar_t>::type;
    ForwardParams<scalar_t, acc_t> p{static_cast<const scalar_t*>(args.logits),
                                     args.valid,
                                     args.k,
                                     args.rows,
                                     args.d,
                                     args.k_max,
                                     args.largest,
                                     blur_params<acc_t>(args.blur_kernel, args.blur_size, args.grid_h, args.grid_w),
                                     static_cast<acc_t*>(args.scratch),
                                     args.indices,
                                     args.mask,
                                     static_cast<acc_t*>(args.lam),
                                     static_cast<acc_t*>(args.attention)};
    top_tau_forward_kernel<<<grid_for(args.rows, 1), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return static_cast<int>(cudaGetLastError());
  });
}

template <typename acc_t>
int launch_top_tau_backward(const TopTauBackwardArgs& args, cudaStream_t stream) {
  BackwardParams<acc_t> p{static_cast<const acc_t*>(args.attention),
                          args.mask,
                          static_cast<const acc_t*>(args.lam),
                          static_cast<const acc_t*>(args.grad_lam),
                          static_cast<const acc_t*>(args.grad_attention),
                          args.rows,
                          args.d,
                          blur_params<acc_t>(args.blur_kernel, args.blur_size, args.grid_h, args.grid_w),
                          static_cast<acc_t*>(args.scratch),
                          static_cast<acc_t*>(args.grad_logits)};
  top_tau_backward_kernel<acc_t><<<grid_for(args.rows, 1), kThreads, 0, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int top_tau_backward_launch(const TopTauBackwardArgs& args, void* stream) {
  if (args.rows == 0) return 0;
  if (args.blur_kernel != nullptr && args.scratch == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  return args.is_double ? launch_top_tau_backward<double>(args, s) : launch_top_tau_backward<float>(args, s);
}

}  // namespace sopfast::cuda
