// model/gpu/train_kernels.h: the small kernels the GPU model and trainer need besides the ops of
// core/ops/cuda_ops.h, model/layers/*_cuda.h and the designs' ops (variants/*_ops.h):
// weight casts, residual adds, the mean loss and the gradient norm.
//
// T is float or __nv_bfloat16; arithmetic is fp32. Every reduction runs over a fixed grid
// (kReduceBlocks blocks) and then one block in a fixed order: results are bit-identical run
// to run (no atomics). `scratch` is fp32 (or fp64 where noted) device memory
// of kReduceBlocks * 3 elements. Device pointers; enqueued on `stream`; each returns the
// launch's cudaError_t. Declared only in CUDA builds.
#ifndef SATDAR_MODEL_GPU_TRAIN_KERNELS_H_
#define SATDAR_MODEL_GPU_TRAIN_KERNELS_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/reduce_grid.h"

namespace satdar::model::gpu {

using ::satdar::core::cuda::kReduceBlocks;

// out (n) = in (n) rounded to T (the bf16 compute copy of the fp32 master weights).
template <typename T>
cudaError_t CastFromF32(T* out, const float* in, int64_t n, cudaStream_t stream);

// out = a + b (out may alias a or b).
template <typename T>
cudaError_t Add(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream);

// *acc (fp64) += scale * sum(losses[0..n)).
cudaError_t AccumulateLoss(double* acc, const float* losses, int n, double scale,
                           cudaStream_t stream);

// *out (fp64) = sum of x[i]^2 over [0, n). scratch: fp64, kReduceBlocks elements.
cudaError_t SumSquares(double* out, const float* x, int64_t n, double* scratch,
                       cudaStream_t stream);

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_GPU_TRAIN_KERNELS_H_
