// model/variants/muddformer_cuda.h: the CUDA kernels of MUDDFormer's dynamic dense connection
// (model/variants/muddformer.cc is the reference): the GELU of the coefficient MLP and the
// per-token combination of the layer outputs X_0..X_{s-1} into `ways` new inputs,
//   out_w = sum_j (a[r, w*s + j] + static[w*s + j]) X_j,
// where a (N, ld) fp32 is the MLP's output (a cuBLASLt GEMM, the caller's) and static the fp32
// master weights. T is float or __nv_bfloat16; fp32 arithmetic, fixed-order reductions (no
// atomics). Device pointers (the lists too); enqueued on `stream`; each returns the launch's
// cudaError_t. Declared only in CUDA builds; tested by //model:layers_cuda_test (tag gpu).
#ifndef SATDAR_MODEL_VARIANTS_MUDDFORMER_CUDA_H_
#define SATDAR_MODEL_VARIANTS_MUDDFORMER_CUDA_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstdint>

namespace satdar::model::cuda {

constexpr int kMaxMuddWays = 4;

// g = gelu(h) (the erf form); dh = dg gelu'(h) (dh may alias dg).
template <typename T>
cudaError_t GeluForward(T* g, const T* h, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t GeluBackward(T* dh, const T* dg, const T* h, int64_t n, cudaStream_t stream);

// outs[w] (N, C), w < ways, from xs[j] (N, C), j < sources.
template <typename T>
cudaError_t DenseCombineForward(T* const* outs, int ways, const T* const* xs, int sources,
                                const float* a, int ld, const float* stat, int rows, int c,
                                cudaStream_t stream);
// From douts[w], the gradients of outs[w]: dxs[j] += sum_w (a + static)[w, j] douts[w];
// da (N, ld) fp32 and da_t (N, ld) of T (written; padding columns 0) = <X_j, douts[w]> at
// column w*s + j (ColumnSums of da give the static weights' gradient).
template <typename T>
cudaError_t DenseCombineBackward(float* da, T* da_t, T* const* dxs, const T* const* douts,
                                 int ways, const T* const* xs, int sources, const float* a,
                                 int ld, const float* stat, int rows, int c, cudaStream_t stream);

}  // namespace satdar::model::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_VARIANTS_MUDDFORMER_CUDA_H_
