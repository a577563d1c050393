// model/variants/denseformer_ops.h: the arithmetic of DenseFormer's depth-weighted average
// (variants/denseformer.cc decides the data flow), one header for both devices: cpu::
// (denseformer_ops_cpu.cc, the readable reference, f32 and f64) and cuda::
// (denseformer_ops_cuda.cu, f32 and bf16 with fp32 arithmetic). Tested against each other by
// denseformer_ops_test (the CUDA side tag gpu).
//
//   out (n) = sum_j a[j] xs[j] over `count` sources, added in source order; a: the layer's
//   weights in the parameter buffer (on the GPU: the fp32 master weights).
#ifndef SATDAR_MODEL_VARIANTS_DENSEFORMER_OPS_H_
#define SATDAR_MODEL_VARIANTS_DENSEFORMER_OPS_H_

#include <cstdint>

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/cuda/reduce_grid.h"
#endif

namespace satdar::model {

namespace cpu {

template <typename T>
void DwaForward(T* out, const T* const* xs, int count, const T* a, int64_t n);
// dxs[j] += a[j] dy; grad_a[j] += <xs[j], dy> (summed in double).
template <typename T>
void DwaBackward(T* const* dxs, T* grad_a, const T* dy, const T* const* xs, int count,
                 const T* a, int64_t n);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// Reductions over the fixed grid of core/cuda/reduce_grid.h per source, then one thread per
// source in block order (bit-identical run to run). scratch: fp32, count * kReduceBlocks.

// xs, dxs: device arrays of count device pointers.
template <typename T>
absl::Status DwaForward(T* out, const T* const* xs, int count, const float* a, int64_t n,
                        cudaStream_t stream);
template <typename T>
absl::Status DwaBackward(T* const* dxs, float* grad_a, const T* dy, const T* const* xs,
                         int count, const float* a, float* scratch, int64_t n,
                         cudaStream_t stream);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_DENSEFORMER_OPS_H_
