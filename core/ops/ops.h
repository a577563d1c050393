// core/ops/ops.h: the core ops under one name for both devices (docs/ONE_MODEL_PLAN.md, S3).
// Every op takes the execution context first (core/exec.h) and returns absl::Status:
//
//   SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x, out, rstd, inp, weight, n, c, eps));
//
// With x a CpuExec this is the CPU reference (core/ops/<op>.h, cpu::, rows split over x.pool;
// always OkStatus); with x a CudaExec, in CUDA builds, the launcher of cuda_ops.h,
// attention_cuda.h or gemm_cuda.h (enqueued on x.stream). The CPU overloads are inline wrappers
// over the cpu:: functions, so the code and the bits are theirs. The argument lists are the same
// apart from the element types (the CPU is templated on float and double, T everywhere; CUDA on
// float and __nv_bfloat16, with fp32 statistics and parameter gradients), except where noted:
//  - Rope: the CUDA tables cos/sin are always fp32.
//  - MatmulBackwardInput, MatmulBackwardWeightF32 and the GroupedMatmul* layers are CUDA
//    only (mixed-precision forms); CrossEntropyForwardBackward is one fused pass on CUDA and
//    the forward then the backward on the CPU.
//  - Attention: the CPU keeps probs (B,NH,T,T) of T; CUDA takes a DType and void pointers and
//    keeps lse (B,NH,T) fp32 instead (flash-style), its backward's scratch from x.workspace.
//  - AdamWUpdate: the CPU takes T for all four buffers, CUDA fp32 only.
//  - Matmul on CUDA also has a DType form over void pointers (gemm_cuda.h) beside the typed one.
#ifndef SATDAR_CORE_OPS_OPS_H_
#define SATDAR_CORE_OPS_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"
#include "core/ops/adamw.h"
#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/matmul.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"
#include "core/ops/swiglu.h"
#include "core/ops/vocab_parallel.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include "core/ops/attention_cuda.h"
#include "core/ops/cuda_ops.h"
#include "core/ops/gemm_cuda.h"
#endif

namespace satdar::core::ops {

namespace internal {
// A scalar of the element type that does not take part in deducing T (a literal 1.0f serves
// a double op).
template <typename T>
struct Id {
  using type = T;
};
template <typename T>
using NoDeduce = typename Id<T>::type;
}  // namespace internal

// ---- RMSNorm (rmsnorm.h)
template <typename T>
inline absl::Status RmsNormForward(const CpuExec& x, T* out, T* rstd, const T* inp,
                                   const T* weight, int n, int c, double eps) {
  cpu::RmsNormForward(out, rstd, inp, weight, n, c, eps, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status RmsNormBackward(const CpuExec& x, T* dinp, T* dweight, const T* dout,
                                    const T* inp, const T* weight, const T* rstd, int n, int c) {
  cpu::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, n, c, x.pool);
  return absl::OkStatus();
}

// ---- RoPE (rope.h)
template <typename T>
inline absl::Status RopeForward(const CpuExec& exec, T* x, const T* cos, const T* sin, int b,
                                int t, int nh, int hs) {
  cpu::RopeForward(x, cos, sin, b, t, nh, hs, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status RopeBackward(const CpuExec& x, T* dx, const T* cos, const T* sin, int b,
                                 int t, int nh, int hs) {
  cpu::RopeBackward(dx, cos, sin, b, t, nh, hs, x.pool);
  return absl::OkStatus();
}

// ---- SwiGLU (swiglu.h)
template <typename T>
inline absl::Status SwigluForward(const CpuExec& x, T* out, const T* gate_up, int n, int f) {
  cpu::SwigluForward(out, gate_up, n, f, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status SwigluBackward(const CpuExec& x, T* dgate_up, const T* dout, const T* gate_up,
                                   int n, int f) {
  cpu::SwigluBackward(dgate_up, dout, gate_up, n, f, x.pool);
  return absl::OkStatus();
}

// ---- Embedding (embedding.h)
template <typename T>
inline absl::Status EmbeddingForward(const CpuExec& x, T* out, const int32_t* tokens,
                                     const T* table, int n, int c) {
  cpu::EmbeddingForward(out, tokens, table, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status EmbeddingBackward(const CpuExec& x, T* dtable, const T* dout,
                                      const int32_t* tokens, int n, int c) {
  cpu::EmbeddingBackward(dtable, dout, tokens, n, c, x.pool);
  return absl::OkStatus();
}

// ---- Softmax cross-entropy (cross_entropy.h)
template <typename T>
inline absl::Status CrossEntropyForward(const CpuExec& x, T* losses, const T* logits,
                                        const int32_t* targets, int n, int v) {
  cpu::CrossEntropyForward(losses, logits, targets, n, v, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status CrossEntropyBackward(const CpuExec& x, T* dlogits, const T* logits,
                                         const int32_t* targets, internal::NoDeduce<T> dloss,
                                         int n, int v) {
  cpu::CrossEntropyBackward(dlogits, logits, targets, dloss, n, v, x.pool);
  return absl::OkStatus();
}
// Both: the losses, then the gradient (CUDA fuses them into one pass over the logits; the
// CPU runs the two loops above, so dlogits may alias logits here too).
template <typename T>
inline absl::Status CrossEntropyForwardBackward(const CpuExec& x, T* losses, T* dlogits,
                                                const T* logits, const int32_t* targets,
                                                internal::NoDeduce<T> dloss, int n, int v) {
  cpu::CrossEntropyForward(losses, logits, targets, n, v, x.pool);
  cpu::CrossEntropyBackward(dlogits, logits, targets, dloss, n, v, x.pool);
  return absl::OkStatus();
}

// ---- Vocabulary-parallel embedding and cross-entropy (vocab_parallel.h)
template <typename T>
inline absl::Status VocabSliceEmbeddingForward(const CpuExec& x, T* out, const int32_t* tokens,
                                               const T* table, int v0, int vl, int n, int c) {
  cpu::VocabSliceEmbeddingForward(out, tokens, table, v0, vl, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status VocabSliceEmbeddingBackward(const CpuExec& x, T* dtable, const T* dout,
                                                const int32_t* tokens, int v0, int vl, int n,
                                                int c) {
  cpu::VocabSliceEmbeddingBackward(dtable, dout, tokens, v0, vl, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status VocabParallelRowMax(const CpuExec& x, T* row_max, const T* logits, int n,
                                        int vl) {
  cpu::VocabParallelRowMax(row_max, logits, n, vl, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status VocabParallelSumExp(const CpuExec& x, T* sum_exp, T* target_logit,
                                        const T* logits, const T* row_max,
                                        const int32_t* targets, int v0, int n, int vl) {
  cpu::VocabParallelSumExp(sum_exp, target_logit, logits, row_max, targets, v0, n, vl, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status VocabParallelLoss(const CpuExec& x, T* losses, T* lse, const T* row_max,
                                      const T* sum_exp, const T* target_logit, int n) {
  cpu::VocabParallelLoss(losses, lse, row_max, sum_exp, target_logit, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status VocabParallelCrossEntropyBackward(const CpuExec& x, T* dlogits,
                                                      const T* logits, const T* lse,
                                                      const int32_t* targets,
                                                      internal::NoDeduce<T> scale, int v0, int n,
                                                      int vl) {
  cpu::VocabParallelCrossEntropyBackward(dlogits, logits, lse, targets, scale, v0, n, vl, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MaskPaddedVocab(const CpuExec& x, T* logits, int n, int vl, int vtrue) {
  cpu::MaskPaddedVocab(logits, n, vl, vtrue, x.pool);
  return absl::OkStatus();
}

// ---- The linear layer (matmul.h): out (M,N) = inp (M,K) weight^T.
template <typename T>
inline absl::Status MatmulForward(const CpuExec& x, T* out, const T* inp, const T* weight, int m,
                                  int n, int k) {
  cpu::MatmulForward(out, inp, weight, m, n, k, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MatmulBackward(const CpuExec& x, T* dinp, T* dweight, const T* dout,
                                   const T* inp, const T* weight, int m, int n, int k) {
  cpu::MatmulBackward(dinp, dweight, dout, inp, weight, m, n, k, x.pool);
  return absl::OkStatus();
}

// ---- Causal GQA attention (attention.h). CUDA: probs -> lse, see the top of this file.
template <typename T>
inline absl::Status AttentionForward(const CpuExec& x, T* out, T* probs, const T* q, const T* k,
                                     const T* v, int b, int t, int nh, int nkv, int hs) {
  cpu::AttentionForward(out, probs, q, k, v, b, t, nh, nkv, hs, x.pool);
  return absl::OkStatus();
}
// Inference over a KV cache (attention.h): no probs; CUDA takes a DType and void pointers and
// writes lse (B,NH,TN) fp32 unless it is null (attention_cuda.h).
template <typename T>
inline absl::Status AttentionCachedForward(const CpuExec& x, T* out, const T* q, const T* k,
                                           const T* v, int b, int tn, int past, int cap, int nh,
                                           int nkv, int hs) {
  cpu::AttentionCachedForward(out, q, k, v, b, tn, past, cap, nh, nkv, hs, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status AttentionBackward(const CpuExec& x, T* dq, T* dk, T* dv, const T* dout,
                                      const T* probs, const T* q, const T* k, const T* v, int b,
                                      int t, int nh, int nkv, int hs) {
  cpu::AttentionBackward(dq, dk, dv, dout, probs, q, k, v, b, t, nh, nkv, hs, x.pool);
  return absl::OkStatus();
}

// ---- AdamW (adamw.h)
template <typename T>
inline absl::Status AdamWUpdate(const CpuExec& x, T* param, const T* grad, T* m, T* v, int64_t n,
                                const AdamWParams& p) {
  cpu::AdamWUpdate(param, grad, m, v, n, p, x.pool);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::AdamWUpdate;
using cuda::AttentionBackward;
using cuda::AttentionCachedForward;
using cuda::AttentionForward;
using cuda::CrossEntropyBackward;
using cuda::CrossEntropyForward;
using cuda::CrossEntropyForwardBackward;
using cuda::EmbeddingBackward;
using cuda::EmbeddingForward;
using cuda::GroupedMatmulBackward;
using cuda::GroupedMatmulBackwardF32;
using cuda::GroupedMatmulForward;
using cuda::MaskPaddedVocab;
using cuda::MatmulBackward;
using cuda::MatmulBackwardInput;
using cuda::MatmulBackwardWeightF32;
using cuda::MatmulForward;
using cuda::RmsNormBackward;
using cuda::RmsNormForward;
using cuda::RopeBackward;
using cuda::RopeForward;
using cuda::SwigluBackward;
using cuda::SwigluForward;
using cuda::VocabParallelCrossEntropyBackward;
using cuda::VocabParallelLoss;
using cuda::VocabParallelRowMax;
using cuda::VocabParallelSumExp;
using cuda::VocabSliceEmbeddingBackward;
using cuda::VocabSliceEmbeddingForward;
#endif

}  // namespace satdar::core::ops

#endif  // SATDAR_CORE_OPS_OPS_H_
