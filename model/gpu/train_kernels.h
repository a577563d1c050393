// model/gpu/train_kernels.h: the small kernels the GPU model and trainer need besides the ops of
// core/ops/cuda_ops.h and the designs' ops (variants/*_ops.h):
// weight casts, residual adds, the mean loss and the gradient norm.
//
// T is float or __nv_bfloat16; arithmetic is fp32. Every reduction runs over a fixed grid
// (kReduceBlocks blocks) and then one block in a fixed order: results are bit-identical run
// to run (no atomics); SumSquares's scratch comes from x.workspace (FailedPrecondition when
// null), AccumulateLoss needs none.
// Each takes the execution context first (core/exec.h) and device pointers, is enqueued on
// x.stream and returns the launch's error as a Status. Declared only in CUDA builds.
#ifndef SATDAR_MODEL_GPU_TRAIN_KERNELS_H_
#define SATDAR_MODEL_GPU_TRAIN_KERNELS_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/cuda/reduce_grid.h"
#include "core/exec.h"

namespace satdar::model::gpu {

using ::satdar::core::CudaExec;
using ::satdar::core::cuda::kReduceBlocks;

// out (n) = in (n) rounded to T (the bf16 compute copy of the fp32 master weights).
template <typename T>
absl::Status CastFromF32(const CudaExec& x, T* out, const float* in, int64_t n);

// out = a + b (out may alias a or b).
template <typename T>
absl::Status Add(const CudaExec& x, T* out, const T* a, const T* b, int64_t n);

// *acc (fp64) += scale * sum(losses[0..n)).
absl::Status AccumulateLoss(const CudaExec& x, double* acc, const float* losses, int n,
                            double scale);

// *out (fp64) = sum of v[i]^2 over [0, n). Scratch: fp64, kReduceBlocks elements at most.
absl::Status SumSquares(const CudaExec& x, double* out, const float* v, int64_t n);

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_GPU_TRAIN_KERNELS_H_
