// model/variants/satformer_ops.h: the arithmetic of SATFormer's value gate (variants/
// satformer.cc decides the data flow, the ablations and the statistics), one header for both
// devices: cpu:: (satformer_ops_cpu.cc, the readable reference, f32 and f64) and cuda::
// (satformer_ops_cuda.cu, f32 and bf16 with fp32 arithmetic). Tested against each other by
// satformer_ops_test (the CUDA side tag gpu).
//
// Layer i >= 1, on this rank's NKV KV heads (under tensor parallelism its rows of W_alpha):
//   alpha (N, NKV)     = ReLU(x (N, C) W_alpha (NKV, C)^T)      ValueGateForward
//   vmix (N, NKV, HS)  = v + alpha v1 (alpha per row and head)   ValueMixForward
// and back: ValueMixBackward (dv, dv1, the gate gradients), then ValueGateBackward (dx, dW).
#ifndef SATDAR_MODEL_VARIANTS_SATFORMER_OPS_H_
#define SATDAR_MODEL_VARIANTS_SATFORMER_OPS_H_

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

// alpha (N, NKV) = ReLU(x W^T) (overwritten).
template <typename T>
void ValueGateForward(T* alpha, const T* x, const T* w, int n, int nkv, int c,
                      core::ThreadPool* pool);
// vmix (N, NKV, HS) = v + alpha v1 (overwritten).
template <typename T>
void ValueMixForward(T* vmix, const T* alpha, const T* v, const T* v1, int n, int nkv, int hs,
                     core::ThreadPool* pool);
// dv = dvmix (overwritten), dv1 += alpha dvmix, dalpha (N, NKV) = [alpha > 0] (v1 . dvmix)
// per gate (overwritten; a closed gate passes no gradient).
template <typename T>
void ValueMixBackward(T* dv, T* dv1, T* dalpha, const T* dvmix, const T* v1, const T* alpha,
                      int n, int nkv, int hs, core::ThreadPool* pool);
// dx (N, C) += dalpha W; dw (NKV, C) += dalpha^T x (may be null).
template <typename T>
void ValueGateBackward(T* dx, T* dw, const T* dalpha, const T* x, const T* w, int n, int nkv,
                       int c, core::ThreadPool* pool);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// T is float or __nv_bfloat16 (x, W, v, v1, vmix, dx and the value gradients); alpha, dalpha
// and dw are fp32 and all arithmetic is fp32. Device pointers, enqueued on exec.stream.
// Deterministic: every sum runs in a fixed order (no atomics).
template <typename T>
absl::Status ValueGateForward(const core::CudaExec& exec, float* alpha, const T* x, const T* w,
                              int n, int nkv, int c);
template <typename T>
absl::Status ValueMixForward(const core::CudaExec& exec, T* vmix, const float* alpha, const T* v,
                             const T* v1, int n, int nkv, int hs);
template <typename T>
absl::Status ValueMixBackward(const core::CudaExec& exec, T* dv, T* dv1, float* dalpha,
                              const T* dvmix, const T* v1, const float* alpha, int n, int nkv,
                              int hs);
template <typename T>
absl::Status ValueGateBackward(const core::CudaExec& exec, T* dx, float* dw, const float* dalpha,
                               const T* x, const T* w, int n, int nkv, int c);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(exec, ...) with exec a core::CpuExec (the cpu:: reference)
// or a core::CudaExec (the cuda:: launcher).
namespace ops {

template <typename T>
inline absl::Status ValueGateForward(const core::CpuExec& exec, T* alpha, const T* x, const T* w,
                                     int n, int nkv, int c) {
  cpu::ValueGateForward(alpha, x, w, n, nkv, c, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status ValueMixForward(const core::CpuExec& exec, T* vmix, const T* alpha, const T* v,
                                    const T* v1, int n, int nkv, int hs) {
  cpu::ValueMixForward(vmix, alpha, v, v1, n, nkv, hs, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status ValueMixBackward(const core::CpuExec& exec, T* dv, T* dv1, T* dalpha,
                                     const T* dvmix, const T* v1, const T* alpha, int n, int nkv,
                                     int hs) {
  cpu::ValueMixBackward(dv, dv1, dalpha, dvmix, v1, alpha, n, nkv, hs, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status ValueGateBackward(const core::CpuExec& exec, T* dx, T* dw, const T* dalpha,
                                      const T* x, const T* w, int n, int nkv, int c) {
  cpu::ValueGateBackward(dx, dw, dalpha, x, w, n, nkv, c, exec.pool);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::ValueGateBackward;
using cuda::ValueGateForward;
using cuda::ValueMixBackward;
using cuda::ValueMixForward;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_SATFORMER_OPS_H_
