// model/layers/depth_retrieval.h: attention over depth (AttnRes, DAR). For every token,
//   out = sum_i softmax_i(w . RMSNorm(keys_i; g)) values_i      over S sources,
// where keys_i and values_i are (B*T, C) arrays (DAR's cross-stream variants read keys and
// values from different streams; AttnRes uses the same list for both).
#ifndef SATDAR_MODEL_LAYERS_DEPTH_RETRIEVAL_H_
#define SATDAR_MODEL_LAYERS_DEPTH_RETRIEVAL_H_

#include <vector>

#include "core/thread_pool.h"

namespace satdar::model {

// out (N,C); alpha (N,S) saved for backward; w, g (C).
template <typename T>
void DepthRetrievalForward(T* out, T* alpha, const std::vector<const T*>& keys,
                           const std::vector<const T*>& values, const T* w, const T* g, int n,
                           int c, double eps, core::ThreadPool* pool);

// dkeys[i], dvalues[i] (N,C) += (entries may be null to skip, and may alias each other);
// dw, dg (C) += (reduced in a fixed order).
template <typename T>
void DepthRetrievalBackward(const std::vector<T*>& dkeys, const std::vector<T*>& dvalues, T* dw,
                            T* dg, const T* dout, const T* alpha,
                            const std::vector<const T*>& keys, const std::vector<const T*>& values,
                            const T* w, const T* g, int n, int c, double eps,
                            core::ThreadPool* pool);

// DAR's two retrievals in one pass over the sources (each source row is read once for both):
// for s in {0, 1}, out[s] = sum_i softmax_i(w[s] . RMSNorm(X^{key[s]}_i; g)) X^{value[s]}_i,
// where streams[t] lists stream t's sources. alpha[s] (N,S) is saved for backward.
template <typename T>
struct DualRetrieval {
  const std::vector<const T*>* streams[2];
  int key[2];
  int value[2];
  const T* w[2];  // (C) each
  const T* g;     // (C), shared
};

template <typename T>
void DualDepthRetrievalForward(T* const out[2], T* const alpha[2], const DualRetrieval<T>& r,
                               int n, int c, double eps, core::ThreadPool* pool);

// dstreams[t][i] (N,C) += (null entries skipped); dw[s], dg (C) += in a fixed order.
template <typename T>
void DualDepthRetrievalBackward(const std::vector<T*>* const dstreams[2], T* const dw[2], T* dg,
                                const T* const dout[2], const T* const alpha[2],
                                const DualRetrieval<T>& r, int n, int c, double eps,
                                core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYERS_DEPTH_RETRIEVAL_H_
