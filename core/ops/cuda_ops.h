// core/ops/cuda_ops.h: CUDA forward and backward kernels of the elementwise and row ops, each
// with the semantics of its CPU reference in core/ops/<op>.h (same shapes, same eps, same
// accumulate-or-overwrite convention). Every entry point takes the execution context first
// (core/exec.h; only its stream is used here) and device pointers, is enqueued on x.stream and
// returns the launch's error as an absl::Status (SATDAR_CUDA_RETURN_IF_ERROR); nothing
// synchronises. core/ops/ops.h puts these and the CPU references under one name:
// ops::RmsNormForward(x, ...) with x a CpuExec or a CudaExec.
//
// Types: T is float or __nv_bfloat16 (activations and the weights they are combined with; the
// templates are instantiated for those two only). Arithmetic is fp32 throughout (bf16 values
// are widened on load and rounded to nearest even on store). Saved statistics (rstd, losses)
// and parameter gradients (dweight, dtable) are fp32 whatever T is. Reductions run in a fixed
// order, so every kernel here gives bit-identical results run to run (no atomics).
//
// Declared only in CUDA builds (SATDAR_WITH_CUDA, or when nvcc compiles the kernels); the
// kernels live in rmsnorm_cuda.cu, rope_cuda.cu, swiglu_cuda.cu, embedding_cuda.cu,
// cross_entropy_cuda.cu and vocab_parallel_cuda.cu. Tested against the CPU path by
// //core/ops:ops_cuda_test (tag gpu).
#ifndef SATDAR_CORE_OPS_CUDA_OPS_H_
#define SATDAR_CORE_OPS_CUDA_OPS_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"

namespace satdar::core::cuda {

// ---- RMSNorm (rmsnorm.h): y = g * x / sqrt(mean(x^2) + eps) over the last dimension C.
// out (N,C), rstd (N) fp32, inp (N,C), weight (C). out may alias inp.
template <typename T>
absl::Status RmsNormForward(const CudaExec& x, T* out, float* rstd, const T* inp, const T* weight,
                            int n, int c, float eps);
// dinp (N,C) += ...; dweight (C) fp32 += ... (may be null). rstd from the forward.
template <typename T>
absl::Status RmsNormBackward(const CudaExec& x, T* dinp, float* dweight, const T* dout,
                             const T* inp, const T* weight, const float* rstd, int n, int c);

// ---- RoPE (rope.h), Hugging Face half-split convention. cos, sin: fp32 tables (T, HS/2) as
// written by cpu::RopeTables<float>. x (B,T,NH,HS) rotated in place; backward applies the
// transpose rotation to dx in place. (The context is `exec` here: `x` is the tensor.)
template <typename T>
absl::Status RopeForward(const CudaExec& exec, T* x, const float* cos, const float* sin, int b,
                         int t, int nh, int hs);
template <typename T>
absl::Status RopeBackward(const CudaExec& x, T* dx, const float* cos, const float* sin, int b,
                          int t, int nh, int hs);

// ---- SwiGLU (swiglu.h) over fused rows: gate_up (N,2F) = [gate | up], out (N,F) =
// silu(gate) * up. Backward overwrites dgate_up (N,2F) (not accumulated); dout (N,F).
template <typename T>
absl::Status SwigluForward(const CudaExec& x, T* out, const T* gate_up, int n, int f);
template <typename T>
absl::Status SwigluBackward(const CudaExec& x, T* dgate_up, const T* dout, const T* gate_up, int n,
                            int f);

// ---- Embedding (embedding.h): out (N,C) = table[tokens] with table (V,C), tokens in [0,V).
template <typename T>
absl::Status EmbeddingForward(const CudaExec& x, T* out, const int32_t* tokens, const T* table,
                              int n, int c);
// dtable (V,C) fp32 += scatter of dout (N,C). Sort-free and deterministic: each thread owns
// one column of the rows whose token falls in its residue class (token mod P) and adds the
// gradients of those tokens in token order, so every element of dtable receives its additions
// in the same order as the CPU reference (bit-identical in f32).
template <typename T>
absl::Status EmbeddingBackward(const CudaExec& x, float* dtable, const T* dout,
                               const int32_t* tokens, int n, int c);

// ---- Softmax cross-entropy (cross_entropy.h), one row of logits (N,V) per block.
// losses (N) fp32 = logsumexp(logits[i]) - logits[i][targets[i]].
template <typename T>
absl::Status CrossEntropyForward(const CudaExec& x, float* losses, const T* logits,
                                 const int32_t* targets, int n, int v);
// dlogits (N,V) = dloss * (softmax(logits) - onehot(targets)); overwrites, may alias logits.
template <typename T>
absl::Status CrossEntropyBackward(const CudaExec& x, T* dlogits, const T* logits,
                                  const int32_t* targets, float dloss, int n, int v);
// Both in one pass over the logits: losses as the forward, dlogits as the backward (may alias
// logits, so the logits buffer can be turned into its own gradient).
template <typename T>
absl::Status CrossEntropyForwardBackward(const CudaExec& x, float* losses, T* dlogits,
                                         const T* logits, const int32_t* targets, float dloss,
                                         int n, int v);

// ---- Vocabulary-parallel embedding and cross-entropy (vocab_parallel.h): this TP rank holds
// the vocabulary slice [v0, v0 + VL); the caller reduces over TP between the steps (max of
// row_max; sums of the lookup, sum_exp and target_logit). N rows, C hidden, VL >= 1.
// out (N,C): row i = table[tokens[i] - v0] (table (VL,C)) when the token is in the slice, else 0.
template <typename T>
absl::Status VocabSliceEmbeddingForward(const CudaExec& x, T* out, const int32_t* tokens,
                                        const T* table, int v0, int vl, int n, int c);
// dtable (VL,C) fp32 += dout (N,C) rows whose token is in the slice; deterministic, each
// element's additions in token order as in EmbeddingBackward (bit-identical to the CPU in f32).
template <typename T>
absl::Status VocabSliceEmbeddingBackward(const CudaExec& x, float* dtable, const T* dout,
                                         const int32_t* tokens, int v0, int vl, int n, int c);
// row_max (N) fp32 = max over this rank's columns of logits (N,VL); one block per row.
template <typename T>
absl::Status VocabParallelRowMax(const CudaExec& x, float* row_max, const T* logits, int n, int vl);
// With row_max reduced over TP: sum_exp (N) fp32 = sum_j exp(logits[i][j] - row_max[i]) over
// this rank's columns (fixed-order block sum); target_logit (N) fp32 = logits[i][targets[i] -
// v0] when the target is in the slice, else 0.
template <typename T>
absl::Status VocabParallelSumExp(const CudaExec& x, float* sum_exp, float* target_logit,
                                 const T* logits, const float* row_max, const int32_t* targets,
                                 int v0, int n, int vl);
// With sum_exp and target_logit summed over TP: lse (N) = row_max + log(sum_exp),
// losses (N) = lse - target_logit (all fp32).
absl::Status VocabParallelLoss(const CudaExec& x, float* losses, float* lse, const float* row_max,
                               const float* sum_exp, const float* target_logit, int n);
// dlogits (N,VL) = scale * (exp(logits - lse) - onehot(targets - v0)) (the one-hot only where
// the target is in the slice); overwrites, may alias logits.
template <typename T>
absl::Status VocabParallelCrossEntropyBackward(const CudaExec& x, T* dlogits, const T* logits,
                                               const float* lse, const int32_t* targets,
                                               float scale, int v0, int n, int vl);
// logits (N,VL): columns [vtrue, VL) = -infinity (padded vocabulary rows); none when vtrue >= VL.
template <typename T>
absl::Status MaskPaddedVocab(const CudaExec& x, T* logits, int n, int vl, int vtrue);

}  // namespace satdar::core::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_CORE_OPS_CUDA_OPS_H_
