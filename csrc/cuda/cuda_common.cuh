// Device helpers of the sopfast CUDA kernels: dtype conversion, warp / block reductions,
// dtype dispatch of the launchers (special values and the row math: top_tau_row.h).  Needs only
// the CUDA toolkit headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sopfast_cuda.h"
#include "sopfast_common.h"
#include "top_tau_row.h"

namespace sopfast::cuda {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kWarp = 32;

// ---- conversions between storage types and the math type ----
template <typename acc_t, typename T>
__device__ __forceinline__ acc_t load_as(const T* p) {
  return static_cast<acc_t>(*p);
}
template <>
__device__ __forceinline__ float load_as<float, __half>(const __half* p) {
  return __half2float(*p);
}
template <>
__device__ __forceinline__ float load_as<float, __nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

// Element i of a row stored as float32, float16 or bfloat16 (`dtype`, the same for the whole
// launch), as float: one kernel for the three storage types.
__device__ __forceinline__ float load_float(const void* row, FloatType dtype, int64_t i) {
  if (dtype == FloatType::kFloat32) return static_cast<const float*>(row)[i];
  const unsigned short bits = static_cast<const unsigned short*>(row)[i];
  return dtype == FloatType::kBFloat16 ? __uint_as_float(static_cast<uint32_t>(bits) << 16)
                                       : __half2float(__ushort_as_half(bits));
}

template <typename T, typename acc_t>
__device__ __forceinline__ T cast_to(acc_t v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half cast_to<__half, float>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 cast_to<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- reductions ----
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
// Maximum (of values without NaN: NaN is tracked separately by the callers).
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return b > a ? b : a;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// All-reduce over a block of THREADS threads (a multiple of 32); every thread must call it.
template <int THREADS, typename T, typename Op>
__device__ T block_allreduce(T v, Op op) {
  static_assert(THREADS % kWarp == 0 && THREADS <= 1024, "THREADS must be a multiple of 32, at most 1024");
  constexpr int warps = THREADS / kWarp;
  __shared__ T partial[warps];
  v = warp_allreduce(v, op);
  __syncthreads();  // earlier readers of `partial` are done
  if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = v;
  __syncthreads();
  T total = partial[0];
#pragma unroll
  for (int w = 1; w < warps; ++w) total = op(total, partial[w]);
  return total;
}

// Over the warps of a block of THREADS threads, each passing one `count` (the same on its lanes):
// the sum of the counts of the lower warps, and in `total` of all of them.
template <int THREADS>
__device__ int block_warps_before(int count, int* total) {
  constexpr int warps = THREADS / kWarp;
  __shared__ int warp_counts[warps];
  const int warp = threadIdx.x / kWarp;
  __syncthreads();  // earlier readers of `warp_counts` are done
  if (threadIdx.x % kWarp == 0) warp_counts[warp] = count;
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < warps; ++w) {
    before += w < warp ? warp_counts[w] : 0;
    sum += warp_counts[w];
  }
  *total = sum;
  return before;
}

// Grid size for a grid-stride loop over `work` items handled `per_block` at a time.
inline unsigned grid_for(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (1 << 30) ? (1 << 30) : blocks));
}

// Calls f(T{}) with T the storage type of `dtype`.
template <typename F>
int dispatch_float_type(FloatType dtype, F&& f) {
  switch (dtype) {
    case FloatType::kFloat32:
      return f(float{});
    case FloatType::kFloat16:
      return f(__half{});
    case FloatType::kBFloat16:
      return f(__nv_bfloat16{});
    case FloatType::kFloat64:
      return f(double{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

// The math type of a storage type.
template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};

}  // namespace sopfast::cuda
