// core/ops/embedding.h: token embedding lookup, out[i] = table[tokens[i]].
#ifndef SATDAR_CORE_OPS_EMBEDDING_H_
#define SATDAR_CORE_OPS_EMBEDDING_H_

#include <cstdint>

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// out (N,C), tokens (N) in [0, V), table (V,C).
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int n, int c,
                      ThreadPool* pool);

// dtable (V,C) += scatter of dout (N,C). Threads own disjoint column ranges (no races, and the
// order of additions per element is the token order, so the result is reproducible).
template <typename T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int n, int c,
                       ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_EMBEDDING_H_
