// model/variants/depth_retrieval_ops.h: the attention over depth of AttnRes and DAR
// (variants/depth_sources.h with attnres.cc, and dar.cc decide the data flow: the block states,
// the routes, the mix and the writes), one header for both devices: cpu::
// (depth_retrieval_ops_cpu.cc, the reference, f32 and f64) and cuda::
// (depth_retrieval_ops_cuda.cu, f32 and bf16 with fp32 arithmetic). Tested against each other
// by depth_retrieval_ops_test (the CUDA side tag gpu), the CPU side by f64 finite differences.
//
// For every token r of N = B*T, over S sources (S = `sources`, each (N, C)):
//   z_i (r)   = w . RMSNorm(keys_i[r]; g) = rstd_i (w*g . keys_i[r]),  i < S
//   alpha[r]  = softmax_i(z)                                            (N, S), saved
//   out[r]    = sum_i alpha_i values_i[r]                               (N, C)
// AttnRes passes one list as keys and values; DAR's cross-stream routes read keys and values
// from different streams. DAR's two retrievals (one per stream s, with its own query w[s] and a
// shared norm weight g) are the Dual ops: on the CPU one pass over the sources (each source row
// is read once for both); on the GPU two calls of the single retrieval.
//
// The sources and their gradients are reached through arrays of pointers (keys[i], ...): the
// block states live in separate buffers (earlier pipeline stages' read in place). On the CPU
// these are host arrays of host pointers; on the GPU device arrays of device pointers.
#ifndef SATDAR_MODEL_VARIANTS_DEPTH_RETRIEVAL_OPS_H_
#define SATDAR_MODEL_VARIANTS_DEPTH_RETRIEVAL_OPS_H_

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace satdar::core {
class ThreadPool;
}  // namespace satdar::core

namespace satdar::model {

// DAR's two retrievals: for s in {0, 1},
//   out[s] = sum_i softmax_i(w[s] . RMSNorm(X^{key[s]}_i; g)) X^{value[s]}_i,
// where streams[t] lists stream t's `sources` sources (N, C) each. Only the streams some key or
// value names are read (the other entry may be null). The same struct on both devices: host
// pointers on the CPU, device pointers (the lists too) on the GPU.
template <typename T>
struct DualRetrieval {
  const T* const* streams[2];
  int sources;
  int key[2];
  int value[2];
  const T* w[2];  // (C) each
  const T* g;     // (C), shared
};

namespace cpu {

// out (N, C), alpha (N, S) overwritten; keys[i], values[i] (N, C), i < sources; w, g (C).
template <typename T>
void DepthRetrievalForward(T* out, T* alpha, const T* const* keys, const T* const* values,
                           int sources, const T* w, const T* g, int n, int c, double eps,
                           core::ThreadPool* pool);
// dkeys[i], dvalues[i] (N, C) += (entries may be null to skip; dkeys[i] may equal dvalues[i],
// as in AttnRes); dw, dg (C) += (reduced in a fixed order).
template <typename T>
void DepthRetrievalBackward(T* const* dkeys, T* const* dvalues, T* dw, T* dg, const T* dout,
                            const T* alpha, const T* const* keys, const T* const* values,
                            int sources, const T* w, const T* g, int n, int c, double eps,
                            core::ThreadPool* pool);

// out[s] (N, C), alpha[s] (N, S) overwritten, s in {0, 1}.
template <typename T>
void DualDepthRetrievalForward(T* const out[2], T* const alpha[2], const DualRetrieval<T>& r,
                               int n, int c, double eps, core::ThreadPool* pool);
// dstreams[t][i] (N, C) += (null entries skipped; dstreams[t] may be null for a stream no key
// or value names); dw[s], dg (C) += in a fixed order.
template <typename T>
void DualDepthRetrievalBackward(T* const* const dstreams[2], T* const dw[2], T* dg,
                                const T* const dout[2], const T* const alpha[2],
                                const DualRetrieval<T>& r, int n, int c, double eps,
                                core::ThreadPool* pool);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// T is float or __nv_bfloat16 (keys, values, w, g, out and the activation gradients); alpha,
// the scratch and dw, dg are fp32 (dw, dg: the fp32 gradient buffer) and all arithmetic is
// fp32. Device pointers (the pointer arrays too), enqueued on x.stream. Deterministic: every
// sum runs in a fixed order (no atomics). Null entries and aliasing as on the CPU; dw and dg
// may also be null (not wanted).
template <typename T>
absl::Status DepthRetrievalForward(const core::CudaExec& x, T* out, float* alpha,
                                   const T* const* keys, const T* const* values, int sources,
                                   const T* w, const T* g, int n, int c, float eps);
// The backward's scratch, fp32 (N, S) (the per-token factors of the keys in dw and dg, summed
// over the tokens by a second kernel), comes from x.workspace (FailedPrecondition without one).
template <typename T>
absl::Status DepthRetrievalBackward(const core::CudaExec& x, T* const* dkeys,
                                    T* const* dvalues, float* dw, float* dg, const T* dout,
                                    const float* alpha, const T* const* keys,
                                    const T* const* values, int sources, const T* w, const T* g,
                                    int n, int c, float eps);

// The Dual ops as two calls of the single retrieval (target 0, then 1): the same math as the
// CPU's one pass, reading the key sources twice. `r` holds device pointers; the struct itself
// is read on the host. The backward's two calls take the same (N, S) scratch in turn.
template <typename T>
absl::Status DualDepthRetrievalForward(const core::CudaExec& x, T* const out[2],
                                       float* const alpha[2], const DualRetrieval<T>& r, int n,
                                       int c, float eps);
template <typename T>
absl::Status DualDepthRetrievalBackward(const core::CudaExec& x, T* const* const dstreams[2],
                                        float* const dw[2], float* dg, const T* const dout[2],
                                        const float* const alpha[2], const DualRetrieval<T>& r,
                                        int n, int c, float eps);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(x, ...) with x a core::CpuExec (the cpu:: reference,
// rows over x.pool; eps in double) or a core::CudaExec (the cuda:: launcher; eps in float).
namespace ops {

template <typename T>
inline absl::Status DepthRetrievalForward(const core::CpuExec& x, T* out, T* alpha,
                                          const T* const* keys, const T* const* values,
                                          int sources, const T* w, const T* g, int n, int c,
                                          double eps) {
  cpu::DepthRetrievalForward(out, alpha, keys, values, sources, w, g, n, c, eps, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DepthRetrievalBackward(const core::CpuExec& x, T* const* dkeys,
                                           T* const* dvalues, T* dw, T* dg, const T* dout,
                                           const T* alpha, const T* const* keys,
                                           const T* const* values, int sources, const T* w,
                                           const T* g, int n, int c, double eps) {
  cpu::DepthRetrievalBackward(dkeys, dvalues, dw, dg, dout, alpha, keys, values, sources, w, g,
                              n, c, eps, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DualDepthRetrievalForward(const core::CpuExec& x, T* const out[2],
                                              T* const alpha[2], const DualRetrieval<T>& r,
                                              int n, int c, double eps) {
  cpu::DualDepthRetrievalForward(out, alpha, r, n, c, eps, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DualDepthRetrievalBackward(const core::CpuExec& x,
                                               T* const* const dstreams[2], T* const dw[2],
                                               T* dg, const T* const dout[2],
                                               const T* const alpha[2],
                                               const DualRetrieval<T>& r, int n, int c,
                                               double eps) {
  cpu::DualDepthRetrievalBackward(dstreams, dw, dg, dout, alpha, r, n, c, eps, x.pool);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::DepthRetrievalBackward;
using cuda::DepthRetrievalForward;
using cuda::DualDepthRetrievalBackward;
using cuda::DualDepthRetrievalForward;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_DEPTH_RETRIEVAL_OPS_H_
