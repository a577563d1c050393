// model/variants/transparent_ops.h: the arithmetic Transparent Attention adds to DenseFormer's
// weighted sum (variants/depth_sources.h and transparent.cc decide the data flow; the sum and its gradient are
// denseformer_ops.h's DwaForward/DwaBackward): the softmax of one sublayer's static depth
// logits and its backward. One header for both devices: cpu:: (transparent_ops_cpu.cc, the
// readable reference, f32 and f64) and cuda:: (transparent_ops_cuda.cu, fp32: the logits are
// master weights). Tested against each other by transparent_ops_test (the CUDA side tag gpu).
//
//   a (count) = softmax(z), max-subtracted, summed in double; z: the logits in the parameter
//   buffer (on the GPU: the fp32 master weights).
#ifndef SATDAR_MODEL_VARIANTS_TRANSPARENT_OPS_H_
#define SATDAR_MODEL_VARIANTS_TRANSPARENT_OPS_H_

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace satdar::model {

namespace cpu {

template <typename T>
void DepthSoftmaxForward(T* a, const T* z, int count);
// grad_z[i] += a[i] (grad_a[i] - sum_j a[j] grad_a[j]).
template <typename T>
void DepthSoftmaxBackward(T* grad_z, const T* a, const T* grad_a, int count);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// One thread over the count logits (a sublayer has at most 2L + 1 sources), in source order:
// bit-identical run to run. Enqueued on x.stream; a, z, grad_z, grad_a are device pointers.
absl::Status DepthSoftmaxForward(const core::CudaExec& x, float* a, const float* z, int count);
absl::Status DepthSoftmaxBackward(const core::CudaExec& x, float* grad_z, const float* a,
                                  const float* grad_a, int count);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(x, ...) with x a core::CpuExec (the cpu:: reference,
// on the calling thread: x.pool is unused) or a core::CudaExec (the cuda:: launcher).
namespace ops {

template <typename T>
inline absl::Status DepthSoftmaxForward(const core::CpuExec& x, T* a, const T* z, int count) {
  (void)x;
  cpu::DepthSoftmaxForward(a, z, count);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DepthSoftmaxBackward(const core::CpuExec& x, T* grad_z, const T* a,
                                         const T* grad_a, int count) {
  (void)x;
  cpu::DepthSoftmaxBackward(grad_z, a, grad_a, count);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::DepthSoftmaxBackward;
using cuda::DepthSoftmaxForward;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_TRANSPARENT_OPS_H_
