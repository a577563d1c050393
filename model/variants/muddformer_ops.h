// model/variants/muddformer_ops.h: the arithmetic of MUDDFormer's dynamic dense connection
// (variants/muddformer.cc decides the data flow: the blocks, the coefficient MLP's RMSNorm and
// GEMMs, the pipeline boundaries), one header for both devices: cpu:: (muddformer_ops_cpu.cc,
// the readable reference, f32 and f64) and cuda:: (muddformer_ops_cuda.cu, f32 and bf16 with
// fp32 arithmetic). Tested against each other by muddformer_ops_test (the CUDA side tag gpu).
//
// The connection after block i mixes the layer outputs X_0..X_{s-1} (s = sources = i + 2, each
// (N, C), N = B*T rows) per token into `ways` new inputs (4: X^Q, X^K, X^V, X^R of block i+1;
// 1 after the last block: x_final):
//   h (N, K) = RMS(X_{i+1}) w1^T                         the caller (RMSNorm, GEMM)
//   g (N, K) = gelu(h), the erf form                     GeluForward
//   a (N, ld) = g w2^T, columns w*s + j < ways * s       the caller (GEMM; ld >= ways * s)
//   out_w = sum_j (a[r, w*s + j] + static[w*s + j]) X_j  DenseCombineForward
// and back: DenseCombineBackward (dX_j, da, the static weights' gradient), the caller's GEMM
// (dg = da w2, dw2), GeluBackward (dh), the caller's GEMM and RMSNorm backward.
//
// The X_j, outs and their gradients are reached through arrays of pointers (xs[j], outs[w],
// ...): the X_j live in separate buffers (earlier pipeline stages' read in place). On the CPU
// these are host arrays of host pointers; on the GPU device arrays of device pointers.
#ifndef SATDAR_MODEL_VARIANTS_MUDDFORMER_OPS_H_
#define SATDAR_MODEL_VARIANTS_MUDDFORMER_OPS_H_

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

namespace cpu {

// g = gelu(h) = h/2 (1 + erf(h / sqrt 2)), n elements (N * K flattened).
template <typename T>
void GeluForward(T* g, const T* h, int64_t n, core::ThreadPool* pool);
// dh = dg gelu'(h) (overwritten; dh may alias dg).
template <typename T>
void GeluBackward(T* dh, const T* dg, const T* h, int64_t n, core::ThreadPool* pool);

// outs[w] (N, C) = sum_j (a[r, w*s + j] + stat[w*s + j]) xs[j] (overwritten), w < ways, j <
// sources = s, added in source order. a (N, ld), ld >= ways * sources; stat (ways, sources), the
// static weights in the parameter buffer. outs must not alias xs.
template <typename T>
void DenseCombineForward(T* const* outs, int ways, const T* const* xs, int sources, const T* a,
                         int ld, const T* stat, int rows, int c, core::ThreadPool* pool);
// From douts[w] (N, C), the gradients of outs[w]: dxs[j] += sum_w (a + stat)[r, w*s + j]
// douts[w] (added in way order); da (N, ld) = <xs[j], douts[w]> per token at column w*s + j
// (overwritten; padding columns 0); grad_stat (ways, sources) += the column sums of da, added
// in row order. dxs must not alias xs or douts.
template <typename T>
void DenseCombineBackward(T* da, T* grad_stat, T* const* dxs, const T* const* douts, int ways,
                          const T* const* xs, int sources, const T* a, int ld, const T* stat,
                          int rows, int c, core::ThreadPool* pool);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// The most ways DenseCombine* take (each thread's accumulators): MUDDFormer's four.
inline constexpr int kMaxMuddWays = 4;

// T is float or __nv_bfloat16 (h, g, the X_j, outs and their gradients); a, da, stat and
// grad_stat are fp32 (a: the w2 GEMM's fp32 output; stat and grad_stat: the fp32 master
// weights and gradients) and all arithmetic is fp32. Device pointers (the pointer arrays
// too), enqueued on x.stream. Deterministic: every sum runs in a fixed order (no atomics).
// DenseCombine* return InvalidArgument for ways outside [1, kMaxMuddWays] or ld < ways *
// sources.
template <typename T>
absl::Status GeluForward(const core::CudaExec& x, T* g, const T* h, int64_t n);
template <typename T>
absl::Status GeluBackward(const core::CudaExec& x, T* dh, const T* dg, const T* h, int64_t n);
template <typename T>
absl::Status DenseCombineForward(const core::CudaExec& x, T* const* outs, int ways,
                                 const T* const* xs, int sources, const float* a, int ld,
                                 const float* stat, int rows, int c);
// The one argument the CPU side lacks: da_t (N, ld), da rounded to T (padding columns 0), for
// the caller's GEMMs in the compute dtype; da stays fp32 for grad_stat.
template <typename T>
absl::Status DenseCombineBackward(const core::CudaExec& x, float* da, T* da_t, float* grad_stat,
                                  T* const* dxs, const T* const* douts, int ways,
                                  const T* const* xs, int sources, const float* a, int ld,
                                  const float* stat, int rows, int c);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(x, ...) with x a core::CpuExec (the cpu:: reference)
// or a core::CudaExec (the cuda:: launcher).
// DenseCombineBackward's CUDA side also writes da_t (da in the compute dtype); the CPU has
// no such argument.
namespace ops {

template <typename T>
inline absl::Status GeluForward(const core::CpuExec& x, T* g, const T* h, int64_t n) {
  cpu::GeluForward(g, h, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status GeluBackward(const core::CpuExec& x, T* dh, const T* dg, const T* h,
                                 int64_t n) {
  cpu::GeluBackward(dh, dg, h, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DenseCombineForward(const core::CpuExec& x, T* const* outs, int ways,
                                        const T* const* xs, int sources, const T* a, int ld,
                                        const T* stat, int rows, int c) {
  cpu::DenseCombineForward(outs, ways, xs, sources, a, ld, stat, rows, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DenseCombineBackward(const core::CpuExec& x, T* da, T* grad_stat, T* const* dxs,
                                         const T* const* douts, int ways, const T* const* xs,
                                         int sources, const T* a, int ld, const T* stat, int rows,
                                         int c) {
  cpu::DenseCombineBackward(da, grad_stat, dxs, douts, ways, xs, sources, a, ld, stat, rows, c,
                            x.pool);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::DenseCombineBackward;
using cuda::DenseCombineForward;
using cuda::GeluBackward;
using cuda::GeluForward;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_MUDDFORMER_OPS_H_
