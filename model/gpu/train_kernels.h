// model/gpu/train_kernels.h: the small kernels the GPU model and trainer need besides the ops of
// core/ops/cuda_ops.h, model/layers/*_cuda.h and the designs' ops (variants/dar_ops.h):
// weight casts, residual adds, ResFormer's value mix (resformer.cc), DenseFormer's
// depth-weighted average (denseformer.cc), the mean loss and the gradient norm.
//
// T is float or __nv_bfloat16; arithmetic is fp32. Scalar parameters (ResFormer's lambdas,
// DenseFormer's weights) are read from the fp32 master weights on the device, so no step
// waits for the host; their gradients are fp32 and accumulated (+=). Every reduction runs over
// a fixed grid (kReduceBlocks blocks) and then one block in a fixed order: results are
// bit-identical run to run (no atomics). `scratch` is fp32 (or fp64 where noted) device memory
// of kReduceBlocks * 3 elements. Device pointers; enqueued on `stream`; each returns the
// launch's cudaError_t. Declared only in CUDA builds.
#ifndef SATDAR_MODEL_GPU_TRAIN_KERNELS_H_
#define SATDAR_MODEL_GPU_TRAIN_KERNELS_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace satdar::model::gpu {

constexpr int kReduceBlocks = 240;

// out (n) = in (n) rounded to T (the bf16 compute copy of the fp32 master weights).
template <typename T>
cudaError_t CastFromF32(T* out, const float* in, int64_t n, cudaStream_t stream);

// out = a + b (out may alias a or b).
template <typename T>
cudaError_t Add(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream);

// ResFormer (model/variants/resformer.cc) at layer `layer` >= 1 of `layers`: vmix = l1 V1 + l2 V.
// Fixed mode (scale null): l1 = l2 = 0.5. learnable_plus: l1 = scale * softmax(logits)[layer-1],
// l2 = lambda2 (device pointers into the fp32 master weights).
struct ResformerParams {
  const float* scale = nullptr;    // model.value_residual.lambda_scale [1]
  const float* logits = nullptr;   // model.value_residual.lambda_logits [layers - 1]
  const float* lambda2 = nullptr;  // model.layers.{layer}.self_attn.lambda2 [1]
  int layer = 1, layers = 2;
};
template <typename T>
cudaError_t ResformerMixForward(T* vmix, const T* v1, const T* v, const ResformerParams& p,
                                int64_t n, cudaStream_t stream);
// dv = l2 dvmix (overwritten), dv1 += l1 dvmix; learnable_plus: the lambdas' gradients (+=,
// fp32, the same offsets as p's pointers in the gradient buffer). scratch: 2 * kReduceBlocks.
template <typename T>
cudaError_t ResformerMixBackward(T* dv, T* dv1, const T* dvmix, const T* v1, const T* v,
                                 const ResformerParams& p, float* grad_scale, float* grad_logits,
                                 float* grad_lambda2, float* scratch, int64_t n,
                                 cudaStream_t stream);

// DenseFormer's depth-weighted average (model/variants/denseformer.cc): out = sum_j a[j] xs[j]
// over count sources (device pointer lists; a: fp32 master weights), summed in source order.
template <typename T>
cudaError_t DwaForward(T* out, const T* const* xs, int count, const float* a, int64_t n,
                       cudaStream_t stream);
// dxs[j] += a[j] dy; grad_a[j] (fp32) += <xs[j], dy>. scratch: count * kReduceBlocks floats.
template <typename T>
cudaError_t DwaBackward(T* const* dxs, float* grad_a, const T* dy, const T* const* xs, int count,
                        const float* a, float* scratch, int64_t n, cudaStream_t stream);

// *acc (fp64) += scale * sum(losses[0..n)).
cudaError_t AccumulateLoss(double* acc, const float* losses, int n, double scale,
                           cudaStream_t stream);

// *out (fp64) = sum of x[i]^2 over [0, n). scratch: fp64, kReduceBlocks elements.
cudaError_t SumSquares(double* out, const float* x, int64_t n, double* scratch,
                       cudaStream_t stream);

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_GPU_TRAIN_KERNELS_H_
