// Launchers of the CUDA kernels (csrc/cuda/*.cu), callable without torch or CUDA headers.
//
// Every pointer is a device pointer to contiguous row-major data; `stream` is a cudaStream_t.
// Each launcher enqueues its kernel and returns the cudaError_t of the launch (0 = success);
// sopfast::cuda::error_string turns it into text.
#pragma once

#include <cstdint>

#include "sopfast_common.h"

namespace sopfast::cuda {

// Storage type of a float tensor; math runs in float32 (float64 for kFloat64).
enum class FloatType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

const char* error_string(int code);

// x [rows, n] -> p [rows, n] in `dtype`; a row holding NaN, or only -inf, gives NaN.  `warp_rows`: rows of
// n <= 32 (not float64) run the warp-rows kernel (a warp per 32 rows, vector loads, no block barrier) instead
// of the thread-rows one (a block per 128 rows staged through shared memory); the same results.
int sparsemax_forward_launch(const void* x, void* p, int64_t rows, int64_t n, FloatType dtype, bool warp_rows,
                             void* stream);
// p, grad [rows, n] -> grad_x [rows, n], all in `dtype`.
int sparsemax_backward_launch(const void* p, const void* grad, void* grad_x, int64_t rows, int64_t n, FloatType dtype,
                              void* stream);

// Longest top_tau row of the CUDA kernels (d <= 1024: a warp per row; longer: a block per row).
constexpr int64_t kTopTauCudaMaxFeatures = 16384;
// Rows up to this many features stage their blur in shared memory; longer ones need `scratch`.
constexpr int64_t kTopTauSharedFeatures = 1024;

// top_tau forward.  lam, attention, blur_kernel and scratch are in the math type (float64 for
// kFloat64 logits, else float32).  scratch [rows, d] is needed only when blur_kernel is set and
// d > kTopTauSharedFeatures; attention (nullptr: not written) is needed with a blur.  A row without a
// result (python/sopfast/ops/counts.py) keeps no feature: indices -1, mask false, NaN lam and attention.
// d <= kTopTauCudaMaxFeatures.
struct TopTauForwardArgs {
  const void* logits = nullptr;  // [rows, d] in logits_type
  FloatType logits_type = FloatType::kFloat32;
  const bool* valid = nullptr;  // [rows, d] or nullptr (all valid)
  const int64_t* k = nullptr;   // [rows] or nullptr (k_max in every row); clamped to [0, number of valid features]
  int64_t rows = 0, d = 0, k_max = 0;
  bool largest = true;
  bool ties_authors = false;  // rank authors_score (top_tau_row.h), equal ones higher index first when largest
  const void* blur_kernel = nullptr;  // [blur_size] or nullptr
  int64_t blur_size = 0, grid_h = 0, grid_w = 0;
  void* scratch = nullptr;     // [rows, d]
  void* indices = nullptr;     // [rows, k_max] out: int64, or int32 when int32_indices
  bool int32_indices = false;
  bool* mask = nullptr;        // [rows, d] out
  void* lam = nullptr;         // [rows] out
  void* attention = nullptr;   // [rows, d] out, or nullptr
};
int top_tau_forward_launch(const TopTauForwardArgs& args, void* stream);

// top_tau backward; every float buffer is float32 (or float64 when `is_double`).
struct TopTauBackwardArgs {
  bool is_double = false;
  const void* attention = nullptr;       // [rows, d]
  const bool* mask = nullptr;            // [rows, d]
  const void* lam = nullptr;             // [rows]
  const void* grad_lam = nullptr;        // [rows]
  const void* grad_attention = nullptr;  // [rows, d] or nullptr
  int64_t rows = 0, d = 0;
  const void* blur_kernel = nullptr;  // [blur_size] or nullptr
  int64_t blur_size = 0, grid_h = 0, grid_w = 0;
  void* scratch = nullptr;      // [rows, d], needed with a blur when d > kTopTauSharedFeatures
  void* grad_logits = nullptr;  // [rows, d] out
};
int top_tau_backward_launch(const TopTauBackwardArgs& args, void* stream);

// out [batch * groups, prefix + keep, embed]; indices outside [0, tokens) give zero rows.
int gather_tokens_forward_launch(const void* x, const int64_t* indices, void* out, const GatherTokensShape& dims,
                                 FloatType dtype, void* stream);
// Elements of the int64 workspace of gather_tokens_backward_launch: the inverted index of the indices.
int64_t gather_tokens_backward_workspace(const GatherTokensShape& dims);
// grad [batch * groups, prefix + keep, embed] -> grad_x [batch, tokens, embed] (scatter-add,
// float32 accumulation (float64 for kFloat64), deterministic); indices outside [0, tokens) are skipped.
int gather_tokens_backward_launch(const void* grad, const int64_t* indices, void* grad_x, const GatherTokensShape& dims,
                                  FloatType dtype, int64_t* workspace, void* stream);

}  // namespace sopfast::cuda
