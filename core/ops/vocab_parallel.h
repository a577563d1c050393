// core/ops/vocab_parallel.h: the vocabulary-parallel (tensor-parallel) embedding lookup and
// softmax cross-entropy, Megatron-LM's scheme. Each TP rank holds the contiguous slice
// [v0, v0 + VL) of the (padded) vocabulary: table rows (VL,C) and logit columns (N,VL). The
// ops are the arithmetic of one rank; the caller reduces over the TP group between them:
//
//   EmbeddingForward: VocabSliceEmbeddingForward, then sum over TP (all-reduce / reduce-scatter).
//   Cross-entropy:    VocabParallelRowMax      -> all-reduce max of row_max
//                     VocabParallelSumExp      -> all-reduce sum of sum_exp and target_logit
//                     VocabParallelLoss        (lse, losses; identical on every rank)
//                     VocabParallelCrossEntropyBackward (this rank's dlogits columns)
//
// Shapes: N token rows, C hidden size, V the full (padded) vocabulary, VL this rank's slice,
// tokens and targets (N) ids in [0, V). Requires VL >= 1. MaskPaddedVocab fills the logit
// columns of padded vocabulary rows with -inf before the cross-entropy.
#ifndef SATDAR_CORE_OPS_VOCAB_PARALLEL_H_
#define SATDAR_CORE_OPS_VOCAB_PARALLEL_H_

#include <cstdint>

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// out (N,C): row i = table[tokens[i] - v0] when v0 <= tokens[i] < v0 + VL, else 0.
// table (VL,C).
template <typename T>
void VocabSliceEmbeddingForward(T* out, const int32_t* tokens, const T* table, int v0, int vl,
                                int n, int c, ThreadPool* pool);

// dtable (VL,C) += dout (N,C) rows whose token falls in the slice. Threads own disjoint column
// ranges and each element receives its additions in token order (reproducible).
template <typename T>
void VocabSliceEmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int v0, int vl,
                                 int n, int c, ThreadPool* pool);

// row_max (N) = max_j logits[i][j] over this rank's columns; logits (N,VL).
template <typename T>
void VocabParallelRowMax(T* row_max, const T* logits, int n, int vl, ThreadPool* pool);

// With row_max the max over the whole vocabulary (reduced over TP):
// sum_exp (N) = sum_j exp(logits[i][j] - row_max[i]) over this rank's columns (accumulated in
// double, stored as T); target_logit (N) = logits[i][targets[i] - v0] when the target falls in
// the slice, else 0.
template <typename T>
void VocabParallelSumExp(T* sum_exp, T* target_logit, const T* logits, const T* row_max,
                         const int32_t* targets, int v0, int n, int vl, ThreadPool* pool);

// With sum_exp and target_logit summed over TP: lse (N) = row_max + log(sum_exp) (log in
// double), losses (N) = lse - target_logit.
template <typename T>
void VocabParallelLoss(T* losses, T* lse, const T* row_max, const T* sum_exp,
                       const T* target_logit, int n, ThreadPool* pool);

// dlogits (N,VL) = scale * (exp(logits - lse) - onehot(targets - v0)), the one-hot only where
// the target falls in the slice; lse (N) from VocabParallelLoss. Overwrites, may alias logits.
template <typename T>
void VocabParallelCrossEntropyBackward(T* dlogits, const T* logits, const T* lse,
                                       const int32_t* targets, T scale, int v0, int n, int vl,
                                       ThreadPool* pool);

// logits (N,VL): columns [vtrue, VL) = -infinity (padded vocabulary rows get no probability
// and a zero gradient). Nothing to do when vtrue >= VL.
template <typename T>
void MaskPaddedVocab(T* logits, int n, int vl, int vtrue, ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_VOCAB_PARALLEL_H_
