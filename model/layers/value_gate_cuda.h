// model/layers/value_gate_cuda.h: SATFormer's fused value gate and mix on CUDA (the CPU math is
// in model/variants/satformer.cc):
//   alpha (N, NKV) = ReLU(x (N,C) W_alpha (NKV,C)^T)
//   vmix[r, j, :] = v[r, j, :] + alpha[r, j] v1[r, j, :]       (N, NKV, HS)
// Under tensor parallelism N KV heads are this rank's heads (its rows of W_alpha), as on the
// CPU. The GEMM x W^T is a plain dot-product kernel here (NKV is small: one warp per gate).
//
// T is float or __nv_bfloat16 (x, W_alpha, v, v1, vmix and their gradients); alpha, dalpha and
// dW_alpha are fp32; all arithmetic is fp32. Device pointers; enqueued on `stream`; returns
// the launch's cudaError_t. Deterministic (no atomics). Declared only in CUDA builds; tested by
// //model:layers_cuda_test (tag gpu).
#ifndef SATDAR_MODEL_LAYERS_VALUE_GATE_CUDA_H_
#define SATDAR_MODEL_LAYERS_VALUE_GATE_CUDA_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace satdar::model::cuda {

// vmix (N,NKV,HS); alpha (N,NKV) fp32, after the ReLU (saved for backward).
template <typename T>
cudaError_t ValueGateForward(T* vmix, float* alpha, const T* x, const T* w, const T* v,
                             const T* v1, int n, int nkv, int hs, int c, cudaStream_t stream);

// As Satformer::Backward: dv = dvmix (overwritten), dv1 += alpha dvmix, dalpha = [alpha > 0]
// (v1 . dvmix) per gate (fp32 (N,NKV), written: the caller's scratch), dx (N,C) += dalpha W,
// dw (NKV,C) fp32 += dalpha^T x (may be null).
template <typename T>
cudaError_t ValueGateBackward(T* dx, float* dw, T* dv, T* dv1, float* dalpha, const T* dvmix,
                              const T* x, const T* w, const T* v1, const float* alpha, int n,
                              int nkv, int hs, int c, cudaStream_t stream);

}  // namespace satdar::model::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_LAYERS_VALUE_GATE_CUDA_H_
