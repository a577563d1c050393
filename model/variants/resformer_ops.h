// model/variants/resformer_ops.h: the arithmetic of ResFormer's value mix (variants/resformer.cc
// decides the data flow), one header for both devices: cpu:: (resformer_ops_cpu.cc, the
// readable reference, f32 and f64) and cuda:: (resformer_ops_cuda.cu, f32 and bf16 with fp32
// arithmetic). Tested against each other by resformer_ops_test (the CUDA side tag gpu).
//
// Layer `layer` >= 1 of `layers`: vmix = l1 V1 + l2 V. Fixed mode (scale null): l1 = l2 = 0.5.
// learnable_plus: l1 = scale * softmax(logits)[layer - 1], l2 = lambda2, read through pointers
// into the parameter buffer (on the GPU: the fp32 master weights).
#ifndef SATDAR_MODEL_VARIANTS_RESFORMER_OPS_H_
#define SATDAR_MODEL_VARIANTS_RESFORMER_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace satdar::core {
class ThreadPool;
}  // namespace satdar::core

namespace satdar::model {

template <typename S>
struct ResformerLambdas {
  const S* scale = nullptr;    // model.value_residual.lambda_scale [1]; null: fixed mode
  const S* logits = nullptr;   // model.value_residual.lambda_logits [layers - 1]
  const S* lambda2 = nullptr;  // model.layers.{layer}.self_attn.lambda2 [1]
  int layer = 1, layers = 2;
};

namespace cpu {

// l1 and l2 of p (in double).
template <typename T>
void ResformerMix(const ResformerLambdas<T>& p, double* l1, double* l2);
template <typename T>
void ResformerMixForward(T* vmix, const T* v1, const T* v, const ResformerLambdas<T>& p,
                         int64_t n, core::ThreadPool* pool);
// dv = l2 dvmix (overwritten), dv1 += l1 dvmix; learnable_plus: the lambdas' gradients (+=, at
// the same offsets as p's pointers in the gradient buffer).
template <typename T>
void ResformerMixBackward(T* dv, T* dv1, const T* dvmix, const T* v1, const T* v,
                          const ResformerLambdas<T>& p, T* grad_scale, T* grad_logits,
                          T* grad_lambda2, int64_t n);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// Enqueued on x.stream. The backward sums over the fixed grid of core/cuda/reduce_grid.h
// (bit-identical sums), its scratch (fp32, 2 * core::cuda::kReduceBlocks) from x.workspace
// (FailedPrecondition without one).

template <typename T>
absl::Status ResformerMixForward(const core::CudaExec& x, T* vmix, const T* v1, const T* v,
                                 const ResformerLambdas<float>& p, int64_t n);
template <typename T>
absl::Status ResformerMixBackward(const core::CudaExec& x, T* dv, T* dv1, const T* dvmix,
                                  const T* v1, const T* v, const ResformerLambdas<float>& p,
                                  float* grad_scale, float* grad_logits, float* grad_lambda2,
                                  int64_t n);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(x, ...) with x a core::CpuExec (the cpu:: reference)
// or a core::CudaExec (the cuda:: launcher). The CPU backward runs on the calling thread
// (cpu::ResformerMixBackward takes no pool; x.pool is unused).
namespace ops {

template <typename T>
inline absl::Status ResformerMixForward(const core::CpuExec& x, T* vmix, const T* v1,
                                        const T* v, const ResformerLambdas<T>& p, int64_t n) {
  cpu::ResformerMixForward(vmix, v1, v, p, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status ResformerMixBackward(const core::CpuExec& x, T* dv, T* dv1, const T* dvmix,
                                         const T* v1, const T* v, const ResformerLambdas<T>& p,
                                         T* grad_scale, T* grad_logits, T* grad_lambda2,
                                         int64_t n) {
  (void)x;
  cpu::ResformerMixBackward(dv, dv1, dvmix, v1, v, p, grad_scale, grad_logits, grad_lambda2, n);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::ResformerMixBackward;
using cuda::ResformerMixForward;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_RESFORMER_OPS_H_
