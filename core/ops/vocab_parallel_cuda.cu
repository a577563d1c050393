// CUDA vocabulary-parallel embedding and cross-entropy (see vocab_parallel.h and
// vocab_parallel_cpu.cc). fp32 arithmetic for every T; row statistics (row_max, sum_exp,
// target_logit, lse, losses) and the table gradient are fp32.
//
// Row reductions run one block per row of logits (N,VL): each thread strides over the
// columns, then the block combines its threads in a fixed order (warp butterflies, then the
// warps' partials in warp order), and the block size depends on VL alone, so the results are
// bit-identical run to run. The embedding backward is the scheme of embedding_cuda.cu on the
// slice's rows: block (x, y) owns kBlockSize columns of the rows whose local id is congruent to
// y mod kClasses and adds their tokens' gradients in token order (no atomics; in f32 each
// element of dtable gets exactly the CPU's additions in the CPU's order).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "absl/status/status.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/exec.h"
#include "core/ops/cuda_ops.h"

namespace satdar::core::cuda {

namespace {
constexpr int kBlockSize = 256;     // elementwise kernels and the embedding backward
constexpr int kRowBlockSize = 512;  // row reductions; a multiple of 32
constexpr int kClasses = 64;        // local token id residue classes of the embedding backward

using namespace ::satdar::core::cuda::device;  // ToF, FromF, WarpSum (bf16.cuh)

unsigned Blocks(int64_t total) {
  return static_cast<unsigned>((total + kBlockSize - 1) / kBlockSize);
}

// Threads for one row of VL columns: as many warps as the row needs, at most kRowBlockSize.
int RowThreads(int vl) {
  const int t = (vl + 31) / 32 * 32;
  return t < kRowBlockSize ? t : kRowBlockSize;
}

template <typename T>
__global__ void SliceEmbeddingForwardKernel(T* out, const int32_t* tokens, const T* table, int v0,
                                            int vl, int c, int64_t total) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t r = idx / c;
  const int j = static_cast<int>(idx % c);
  const int id = tokens[r] - v0;
  out[idx] = id >= 0 && id < vl ? table[static_cast<int64_t>(id) * c + j] : FromF<T>(0.0f);
}

template <typename T>
__global__ void SliceEmbeddingBackwardKernel(float* dtable, const T* dout, const int32_t* tokens,
                                             int v0, int vl, int n, int c) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int cls = static_cast<int>(blockIdx.y);
  if (j >= c) return;
  for (int i = 0; i < n; ++i) {
    const int id = tokens[i] - v0;
    if (id < 0 || id >= vl || id % kClasses != cls) continue;
    dtable[static_cast<int64_t>(id) * c + j] += ToF(dout[static_cast<int64_t>(i) * c + j]);
  }
}

// Max over the 32 lanes of a warp; every lane gets it.
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The block's max (kMax) or sum (!kMax) of v, in a fixed order; every thread gets it.
template <bool kMax>
__device__ float BlockReduce(float v) {
  __shared__ float part[32];
  v = kMax ? WarpMax(v) : WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const float none = kMax ? -INFINITY : 0.0f;
  v = lane < warps ? part[lane] : none;
  return kMax ? WarpMax(v) : WarpSum(v);
}

template <typename T>
__global__ void RowMaxKernel(float* row_max, const T* logits, int vl) {
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * vl;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < vl; j += blockDim.x) m = fmaxf(m, ToF(x[j]));
  m = BlockReduce<true>(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T>
__global__ void SumExpKernel(float* sum_exp, float* target_logit, const T* logits,
                             const float* row_max, const int32_t* targets, int v0, int vl) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vl;
  const float mx = row_max[row];
  float s = 0.0f;
  for (int j = threadIdx.x; j < vl; j += blockDim.x) s += expf(ToF(x[j]) - mx);
  s = BlockReduce<false>(s);
  if (threadIdx.x == 0) {
    const int id = targets[row] - v0;
    sum_exp[row] = s;
    target_logit[row] = id >= 0 && id < vl ? ToF(x[id]) : 0.0f;
  }
}

__global__ void LossKernel(float* losses, float* lse, const float* row_max, const float* sum_exp,
                           const float* target_logit, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float l = row_max[i] + logf(sum_exp[i]);
  lse[i] = l;
  losses[i] = l - target_logit[i];
}

// Elementwise: each element is read and written by one thread, so dlogits may alias logits.
template <typename T>
__global__ void BackwardKernel(T* dlogits, const T* logits, const float* lse,
                               const int32_t* targets, float scale, int v0, int vl,
                               int64_t total) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t r = idx / vl;
  const int j = static_cast<int>(idx % vl);
  float g = scale * expf(ToF(logits[idx]) - lse[r]);
  if (j == targets[r] - v0) g -= scale;
  dlogits[idx] = FromF<T>(g);
}

template <typename T>
__global__ void MaskPaddedKernel(T* logits, int vl, int first, int64_t total) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int width = vl - first;
  const int64_t r = idx / width;
  logits[r * vl + first + static_cast<int>(idx % width)] = FromF<T>(-INFINITY);
}
}  // namespace

template <typename T>
absl::Status VocabSliceEmbeddingForward(const CudaExec& x, T* out, const int32_t* tokens,
                                        const T* table, int v0, int vl, int n, int c) {
  const int64_t total = static_cast<int64_t>(n) * c;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SliceEmbeddingForwardKernel", SliceEmbeddingForwardKernel<T>,
                                     dim3(Blocks(total)), dim3(kBlockSize), 0, x.stream, out,
                                     tokens, table, v0, vl, c, total));
  return absl::OkStatus();
}

template <typename T>
absl::Status VocabSliceEmbeddingBackward(const CudaExec& x, float* dtable, const T* dout,
                                         const int32_t* tokens, int v0, int vl, int n, int c) {
  if (n <= 0 || c <= 0 || vl <= 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>((c + kBlockSize - 1) / kBlockSize), kClasses);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SliceEmbeddingBackwardKernel",
                                     SliceEmbeddingBackwardKernel<T>, grid, dim3(kBlockSize), 0,
                                     x.stream, dtable, dout, tokens, v0, vl, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status VocabParallelRowMax(const CudaExec& x, float* row_max, const T* logits, int n,
                                 int vl) {
  if (n <= 0 || vl <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RowMaxKernel", RowMaxKernel<T>, dim3(n), dim3(RowThreads(vl)),
                                     0, x.stream, row_max, logits, vl));
  return absl::OkStatus();
}

template <typename T>
absl::Status VocabParallelSumExp(const CudaExec& x, float* sum_exp, float* target_logit,
                                 const T* logits, const float* row_max, const int32_t* targets,
                                 int v0, int n, int vl) {
  if (n <= 0 || vl <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SumExpKernel", SumExpKernel<T>, dim3(n), dim3(RowThreads(vl)),
                                     0, x.stream, sum_exp, target_logit, logits, row_max, targets,
                                     v0, vl));
  return absl::OkStatus();
}

absl::Status VocabParallelLoss(const CudaExec& x, float* losses, float* lse, const float* row_max,
                               const float* sum_exp, const float* target_logit, int n) {
  if (n <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("LossKernel", LossKernel, dim3(Blocks(n)), dim3(kBlockSize), 0,
                                     x.stream, losses, lse, row_max, sum_exp, target_logit, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status VocabParallelCrossEntropyBackward(const CudaExec& x, T* dlogits, const T* logits,
                                               const float* lse, const int32_t* targets,
                                               float scale, int v0, int n, int vl) {
  const int64_t total = static_cast<int64_t>(n) * vl;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("VocabParallelBackwardKernel", BackwardKernel<T>,
                                     dim3(Blocks(total)), dim3(kBlockSize), 0, x.stream, dlogits,
                                     logits, lse, targets, scale, v0, vl, total));
  return absl::OkStatus();
}

template <typename T>
absl::Status MaskPaddedVocab(const CudaExec& x, T* logits, int n, int vl, int vtrue) {
  const int first = vtrue > 0 ? vtrue : 0;
  const int64_t total = static_cast<int64_t>(n) * (vl - first);
  if (n <= 0 || first >= vl) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MaskPaddedKernel", MaskPaddedKernel<T>, dim3(Blocks(total)),
                                     dim3(kBlockSize), 0, x.stream, logits, vl, first, total));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template absl::Status VocabSliceEmbeddingForward<T>(const CudaExec&, T*, const int32_t*,         \
                                                      const T*, int, int, int, int);               \
  template absl::Status VocabSliceEmbeddingBackward<T>(const CudaExec&, float*, const T*,          \
                                                       const int32_t*, int, int, int, int);        \
  template absl::Status VocabParallelRowMax<T>(const CudaExec&, float*, const T*, int, int);       \
  template absl::Status VocabParallelSumExp<T>(const CudaExec&, float*, float*, const T*,          \
                                               const float*, const int32_t*, int, int, int);       \
  template absl::Status VocabParallelCrossEntropyBackward<T>(                                      \
      const CudaExec&, T*, const T*, const float*, const int32_t*, float, int, int, int);          \
  template absl::Status MaskPaddedVocab<T>(const CudaExec&, T*, int, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
