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

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
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
// source in block order (bit-identical run to run); the backward's scratch (fp32,
// count * kReduceBlocks) comes from x.workspace (FailedPrecondition without one).

// xs, dxs: device arrays of count device pointers. Enqueued on x.stream.
template <typename T>
absl::Status DwaForward(const core::CudaExec& x, T* out, const T* const* xs, int count,
                        const float* a, int64_t n);
template <typename T>
absl::Status DwaBackward(const core::CudaExec& x, T* const* dxs, float* grad_a, const T* dy,
                         const T* const* xs, int count, const float* a, int64_t n);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(x, ...) with x a core::CpuExec (the cpu:: reference,
// on the calling thread: x.pool is unused) or a core::CudaExec (the cuda:: launcher).
namespace ops {

template <typename T>
inline absl::Status DwaForward(const core::CpuExec& x, T* out, const T* const* xs, int count,
                               const T* a, int64_t n) {
  (void)x;
  cpu::DwaForward(out, xs, count, a, n);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DwaBackward(const core::CpuExec& x, T* const* dxs, T* grad_a, const T* dy,
                                const T* const* xs, int count, const T* a, int64_t n) {
  (void)x;
  cpu::DwaBackward(dxs, grad_a, dy, xs, count, a, n);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::DwaBackward;
using cuda::DwaForward;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_DENSEFORMER_OPS_H_
