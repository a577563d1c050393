// core/ops/cross_entropy.h: softmax cross-entropy over the vocabulary.
#ifndef SATDAR_CORE_OPS_CROSS_ENTROPY_H_
#define SATDAR_CORE_OPS_CROSS_ENTROPY_H_

#include <cstdint>

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// losses (N) = logsumexp(logits[i]) - logits[i][targets[i]]; logits (N,V).
template <typename T>
void CrossEntropyForward(T* losses, const T* logits, const int32_t* targets, int n, int v,
                         ThreadPool* pool);

// dlogits (N,V) = dloss * (softmax(logits) - onehot(targets)); overwrites, may alias logits.
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, T dloss, int n,
                          int v, ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_CROSS_ENTROPY_H_
