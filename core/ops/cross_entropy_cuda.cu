// CUDA softmax cross-entropy (see cross_entropy.h and cross_entropy_cpu.cc): one block per
// row of logits. One pass computes the row's logsumexp with an online (max, sum) per thread,
// combined over the block in a fixed order; a second pass writes the gradient. fp32
// arithmetic for every T. The backward recomputes the logsumexp, like the CPU one; the fused
// entry point gives the losses and the gradient from the same pass.
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
constexpr int kBlockSize = 512;  // a multiple of 32

using namespace ::satdar::core::cuda::device;  // ToF, FromF, Ld, St, WarpSum (bf16.cuh)

// (max, sum of exp(x - max)) of two parts; an empty part has max = -inf and sum = 0.
__device__ __forceinline__ void Combine(float* m, float* s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (*m == -INFINITY) {
    *m = m2;
    *s = s2;
    return;
  }
  const float mx = fmaxf(*m, m2);
  *s = *s * expf(*m - mx) + s2 * expf(m2 - mx);
  *m = mx;
}

// logsumexp of the block's row; every thread gets it.
__device__ float BlockLogSumExp(float m, float s) {
  __shared__ float sm[32], ss[32];
  for (int o = 16; o > 0; o >>= 1) {
    Combine(&m, &s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  m = lane < warps ? sm[lane] : -INFINITY;
  s = lane < warps ? ss[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    Combine(&m, &s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
  return m + logf(s);
}

template <typename T, bool kLoss, bool kGrad>
__global__ void CrossEntropyKernel(float* losses, T* dlogits, const T* logits,
                                   const int32_t* targets, float dloss, int v) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * v;
  const int target = targets[row];
  // Read before any thread of the block writes the gradient (dlogits may alias logits).
  const float xt = threadIdx.x == 0 ? ToF(x[target]) : 0.0f;
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    const float xj = ToF(x[j]);
    if (xj > m) {
      s = s * expf(m - xj) + 1.0f;
      m = xj;
    } else {
      s += expf(xj - m);
    }
  }
  const float lse = BlockLogSumExp(m, s);  // synchronises the block
  if (kLoss && threadIdx.x == 0) losses[row] = lse - xt;
  if (kGrad) {
    T* d = dlogits + row * v;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
      float g = dloss * expf(ToF(x[j]) - lse);
      if (j == target) g -= dloss;
      d[j] = FromF<T>(g);
    }
  }
}

template <typename T, bool kLoss, bool kGrad>
cudaError_t CrossEntropy(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                         float dloss, int n, int v, cudaStream_t stream) {
  if (n <= 0 || v <= 0) return cudaSuccess;
  // As many warps as the row needs, at most kBlockSize (a 256-token vocabulary gets 8 warps,
  // not 16 with 8 idle); the order of the sums depends on v alone.
  const int threads = (v + 31) / 32 * 32 < kBlockSize ? (v + 31) / 32 * 32 : kBlockSize;
  return Launch("CrossEntropyKernel", CrossEntropyKernel<T, kLoss, kGrad>, dim3(n),
                dim3(threads), 0, stream, losses, dlogits, logits, targets, dloss, v);
}
}  // namespace

template <typename T>
absl::Status CrossEntropyForward(const CudaExec& x, float* losses, const T* logits,
                                 const int32_t* targets, int n, int v) {
  SATDAR_CUDA_RETURN_IF_ERROR(
      (CrossEntropy<T, true, false>(losses, nullptr, logits, targets, 0.0f, n, v, x.stream)));
  return absl::OkStatus();
}

template <typename T>
absl::Status CrossEntropyBackward(const CudaExec& x, T* dlogits, const T* logits,
                                  const int32_t* targets, float dloss, int n, int v) {
  SATDAR_CUDA_RETURN_IF_ERROR(
      (CrossEntropy<T, false, true>(nullptr, dlogits, logits, targets, dloss, n, v, x.stream)));
  return absl::OkStatus();
}

template <typename T>
absl::Status CrossEntropyForwardBackward(const CudaExec& x, float* losses, T* dlogits,
                                         const T* logits, const int32_t* targets, float dloss,
                                         int n, int v) {
  SATDAR_CUDA_RETURN_IF_ERROR(
      (CrossEntropy<T, true, true>(losses, dlogits, logits, targets, dloss, n, v, x.stream)));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                     \
  template absl::Status CrossEntropyForward<T>(const CudaExec&, float*, const T*, const int32_t*, \
                                               int, int);                                         \
  template absl::Status CrossEntropyBackward<T>(const CudaExec&, T*, const T*, const int32_t*,    \
                                                float, int, int);                                 \
  template absl::Status CrossEntropyForwardBackward<T>(const CudaExec&, float*, T*, const T*,     \
                                                       const int32_t*, float, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
