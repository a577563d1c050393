// model/layers/depth_retrieval_cuda.h: the depth retrieval of AttnRes and DAR on CUDA (the CPU
// math is model/layers/depth_retrieval.{h,cc}). For every token r,
//   z_i = (w . RMSNorm(keys_i[r]; g)),  alpha[r] = softmax_i(z),  out[r] = sum_i alpha_i values_i[r]
// over S sources. DAR's two retrievals are two calls (the CPU's single-pass DualDepthRetrieval
// is the same math; a fused CUDA version is not written yet).
//
// T is float or __nv_bfloat16 (keys, values, w, g, out and the activation gradients); alpha,
// the workspace and dw, dg are fp32; all arithmetic is fp32. `keys`, `values`, `dkeys` and
// `dvalues` are DEVICE arrays of S device pointers, each to an (N,C) array. Enqueued on
// `stream`; returns the launch's cudaError_t. Deterministic (no atomics). Declared only in
// CUDA builds; tested by //model:layers_cuda_test (tag gpu).
#ifndef SATDAR_MODEL_LAYERS_DEPTH_RETRIEVAL_CUDA_H_
#define SATDAR_MODEL_LAYERS_DEPTH_RETRIEVAL_CUDA_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace satdar::model::cuda {

// out (N,C); alpha (N,S) fp32, saved for backward; w, g (C).
template <typename T>
cudaError_t DepthRetrievalForward(T* out, float* alpha, const T* const* keys,
                                  const T* const* values, int s, const T* w, const T* g, int n,
                                  int c, float eps, cudaStream_t stream);

// dkeys[i], dvalues[i] (N,C) += (null entries are skipped; dkeys[i] may equal dvalues[i], as
// in AttnRes); dw, dg (C) fp32 += (either may be null). workspace: fp32 (N,S) scratch.
template <typename T>
cudaError_t DepthRetrievalBackward(T* const* dkeys, T* const* dvalues, float* dw, float* dg,
                                   float* workspace, const T* dout, const float* alpha,
                                   const T* const* keys, const T* const* values, int s,
                                   const T* w, const T* g, int n, int c, float eps,
                                   cudaStream_t stream);

}  // namespace satdar::model::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_LAYERS_DEPTH_RETRIEVAL_CUDA_H_
