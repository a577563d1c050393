// model/layers/sinkhorn_cuda.h: mHC's Sinkhorn normalisation of the residual mixing matrix on
// CUDA, in fp32 (the CPU math is Mhc::Coefficients / CoefficientsBackward in
// model/variants/mhc.cc). Per token, from logits Z (n, n):
//   M_0 = row softmax of Z; then M_k = M_{k-1} with its columns (k odd) or rows (k even)
//   divided by their sums, for k = 1 .. 2 * iterations - 1 (ending on a column normalisation).
// mHC uses iterations = 20. Z is what mhc.cc feeds the softmax (scale * raw * rms + base); the
// sigmoid pre/post coefficients and the GEMM around it are not part of this kernel.
//
// One thread per token, n <= kMaxSinkhornStreams (returns cudaErrorInvalidValue otherwise).
// Device pointers; enqueued on `stream`; returns the launch's cudaError_t. Declared only in
// CUDA builds; tested by //model:layers_cuda_test (tag gpu).
#ifndef SATDAR_MODEL_LAYERS_SINKHORN_CUDA_H_
#define SATDAR_MODEL_LAYERS_SINKHORN_CUDA_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_runtime.h>

namespace satdar::model::cuda {

constexpr int kMaxSinkhornStreams = 8;

// logits (N, n, n); steps (N, 2 * iterations, n, n): M_0 .. M_{2 iterations - 1}, kept for the
// backward. The result of token r is steps[r, 2 * iterations - 1].
cudaError_t SinkhornForward(float* steps, const float* logits, int rows, int n, int iterations,
                            cudaStream_t stream);

// dlogits (N, n, n), overwritten: the gradient with respect to Z of dfinal (N, n, n), the
// gradient of the last matrix; steps from the forward.
cudaError_t SinkhornBackward(float* dlogits, const float* dfinal, const float* steps, int rows,
                             int n, int iterations, cudaStream_t stream);

}  // namespace satdar::model::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_LAYERS_SINKHORN_CUDA_H_
