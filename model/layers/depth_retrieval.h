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

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYERS_DEPTH_RETRIEVAL_H_
