// model/variants/hyper_ops.h: the arithmetic of mHC's coefficients (variants/mhc.cc decides the
// data flow: the projection GEMM, the width and depth connections, the pipeline boundaries),
// one header for both devices: cpu:: (hyper_ops_cpu.cc, the readable reference, f32 and f64)
// and cuda:: (hyper_ops_cuda.cu, fp32 coefficients, H in f32 or bf16). Tested against each
// other by hyper_ops_test (the CUDA side tag gpu).
//
// Per token r (N = B*T rows) of the hyper state H (N, n, C) with vec(H) of nc = n*C entries and
// mixes = n(n+2) mix logits laid out [pre n | post n | res n*n]:
//   raw (N, ld) = vec(H) fn^T, ld >= mixes                the caller (GEMM)
//   rms = 1 / sqrt(mean(vec(H)^2) + eps)                   MhcRms
//   pre_j = sigmoid(scale[0] raw_j rms + base_j)           MhcCoefForward: coef (N, 2n)
//   post_j = 2 sigmoid(scale[1] raw_{n+j} rms + base_{n+j})
//   Z_jk = scale[2] raw_{2n+jn+k} rms + base_{2n+jn+k}     MhcCoefForward: logits (N, n, n)
//   M_0 = row softmax of Z; M_s = M_{s-1} with its columns (s odd) or rows (s even) divided
//   by their sums, s = 1 .. 2 iterations - 1 (ending on a column one)   SinkhornForward
// and back: SinkhornBackward (dlogits from dM_last), MhcCoefBackward (draw = d/d raw for the
// caller's GEMMs, scale's and base's gradients, and the rms path into dH).
//
// The width / depth connections and the stream entry / exit (shared with HC) stay as they were:
// inline loops in hyper_connections.cc / mhc.cc / hyper_streams.h on the CPU, hyper_cuda.h on
// the GPU: the CPU loops run per row around the branch call and sum HC's scale gradients in
// double across rows, the GPU kernels are strided by HyperCoefs with per-token partial sums,
// so one op for both needs the fused treatment MhcCoefBackward got (docs/ONE_MODEL_PLAN.md).
//
// The CPU side keeps the CPU model's results bit for bit: per element the same operations in
// the same order as the loops that were inline in mhc.cc; the sums of scale's and base's
// gradients over the rows run in double in row order, as before.
#ifndef SATDAR_MODEL_VARIANTS_HYPER_OPS_H_
#define SATDAR_MODEL_VARIANTS_HYPER_OPS_H_

#include <cstdint>

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>

#include "absl/status/status.h"
#endif

namespace satdar::core {
class ThreadPool;
}  // namespace satdar::core

namespace satdar::model {

// mHC's Sinkhorn iterations (column normalisations): the steps buffers hold 2x this many
// (n, n) matrices per token.
inline constexpr int kMhcSinkhornIterations = 20;

namespace cpu {

// rms (N) = 1 / sqrt(sum_e h[r, e]^2 / nc + eps), h (N, nc); the sum in T, in element order.
template <typename T>
void MhcRms(T* rms, const T* h, int rows, int nc, double eps, core::ThreadPool* pool);

// coef (N, 2n) = [pre | post], logits (N, n, n) = Z, from raw (N, ld) (columns >= mixes
// ignored), rms (N), scale (3) and base (mixes) (the parameters).
template <typename T>
void MhcCoefForward(T* coef, T* logits, const T* raw, int ld, const T* rms, const T* scale,
                    const T* base, int rows, int n, core::ThreadPool* pool);

// steps (N, 2 iterations, n, n) = M_0 .. M_{2 iterations - 1} (kept for the backward; token r's
// result is steps[r, 2 iterations - 1]) from logits (N, n, n).
template <typename T>
void SinkhornForward(T* steps, const T* logits, int rows, int n, int iterations,
                     core::ThreadPool* pool);
// dlogits (N, n, n) (overwritten) = d/dZ of dfinal (N, n, n), the gradient of the last matrix.
template <typename T>
void SinkhornBackward(T* dlogits, const T* dfinal, const T* steps, int rows, int n,
                      int iterations, core::ThreadPool* pool);

// From dcoef (N, mixes) = [dpre | dpost | ignored] and dlogits (N, n, n) (SinkhornBackward's):
//   dz (N, mixes), the gradient of each mix logit (overwritten);
//   draw (N, ld) = dz scale[group] rms (overwritten; padding columns 0) -- d/d raw;
//   grad_scale (3) += sum_r sum_group dz raw rms, grad_base (mixes) += sum_r dz (double sums
//   in row order, added once);
//   dh (N, nc) += -rms^3 / nc (sum_k dz_k scale[group] raw_k) h (the rms path).
// draw may alias dcoef when ld == mixes (a row is read before it is written; the CPU model
// does so); nothing else may alias.
template <typename T>
void MhcCoefBackward(T* draw, T* dz, T* grad_scale, T* grad_base, T* dh, const T* dcoef,
                     const T* dlogits, const T* coef, const T* raw, int ld, const T* rms,
                     const T* scale, const T* h, int rows, int n, int nc,
                     core::ThreadPool* pool);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// T (h, dh, draw) is float or __nv_bfloat16; rms, coef, logits, steps, dcoef, dlogits, dz, raw
// (the GEMM's fp32 output) and the parameters (fp32 master weights and gradients) are fp32,
// and all arithmetic is fp32. Device pointers, enqueued on `stream`. Deterministic: per token
// one thread (coefficients, Sinkhorn) or one block with a fixed tree (MhcRms); the sums over
// tokens are ColumnSums (hyper_cuda.h: fixed partition and tree). No atomics. Every op returns
// InvalidArgument for n outside [1, kMaxHyperStreams] (hyper_cuda.h) or ld < mixes.
template <typename T>
absl::Status MhcRms(float* rms, const T* h, int rows, int nc, float eps, cudaStream_t stream);
absl::Status MhcCoefForward(float* coef, float* logits, const float* raw, int ld,
                            const float* rms, const float* scale, const float* base, int rows,
                            int n, cudaStream_t stream);
absl::Status SinkhornForward(float* steps, const float* logits, int rows, int n, int iterations,
                             cudaStream_t stream);
absl::Status SinkhornBackward(float* dlogits, const float* dfinal, const float* steps, int rows,
                              int n, int iterations, cudaStream_t stream);
// The one argument the CPU side lacks: work (N, 4) fp32 scratch (per token the three scale
// sums and the rms path's coefficient, summed over tokens in a fixed order afterwards). draw
// must not alias dcoef here (dcoef is fp32, draw of T).
template <typename T>
absl::Status MhcCoefBackward(T* draw, float* dz, float* work, float* grad_scale,
                             float* grad_base, T* dh, const float* dcoef, const float* dlogits,
                             const float* coef, const float* raw, int ld, const float* rms,
                             const float* scale, const T* h, int rows, int n, int nc,
                             cudaStream_t stream);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_HYPER_OPS_H_
