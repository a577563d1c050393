// core/ops/attention_cuda.h: fused causal GQA attention on the GPU (flash-style).
//
// Same semantics and layouts as attention.h: q (B,T,NH,HS), k and v (B,T,NKV,HS), query head h
// reads KV head h / (NH/NKV), scale 1/sqrt(HS), causal. Instead of the (B,NH,T,T)
// probabilities the forward saves the log-sum-exp of each score row, lse (B,NH,T) in fp32,
// and the backward recomputes the probabilities from it; no (T,T) matrix is ever stored.
//
// dtype kF32 or kBF16 for q, k, v, out, dout, dq, dk, dv; all arithmetic is fp32. HS <= 128.
// All pointers are device pointers; the calls take the execution context first (core/exec.h),
// are asynchronous on x.stream (nullptr: the legacy default stream) and return launch errors
// only. core/ops/ops.h names them ops::AttentionForward/Backward beside the CPU reference,
// whose argument list differs (it keeps probs (B,NH,T,T) of T where this keeps lse).
#ifndef SATDAR_CORE_OPS_ATTENTION_CUDA_H_
#define SATDAR_CORE_OPS_ATTENTION_CUDA_H_

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/exec.h"

namespace satdar::core::cuda {

constexpr int kAttentionMaxHeadSize = 128;

// out (B,T,NH,HS) overwritten; lse (B,NH,T) fp32 written.
absl::Status AttentionForward(const CudaExec& x, DType dtype, void* out, float* lse, const void* q,
                              const void* k, const void* v, int b, int t, int nh, int nkv, int hs);

// Inference over a KV cache (attention.h's AttentionCachedForward): tn new queries at positions
// past..past+tn-1; q and out (B,TN,NH,HS), k and v (B,CAP,NKV,HS) with rows [0, past+tn)
// filled; lse (B,NH,TN) fp32 written unless null. The training kernel itself (past = 0 and
// tn = cap = t is AttentionForward). One thread per query row: a step of tn = 1 uses one of
// each block's threads (splitting the keys, flash-decoding, would fill them).
// InvalidArgument also when past < 0 or past + tn > cap.
absl::Status AttentionCachedForward(const CudaExec& x, DType dtype, void* out, float* lse,
                                    const void* q, const void* k, const void* v, int b, int tn,
                                    int past, int cap, int nh, int nkv, int hs);

// dq (B,T,NH,HS), dk and dv (B,T,NKV,HS): accumulated (+=), like the CPU backward. `out` and
// `lse` are the forward's. Scratch: B*NH*T fp32 (rowsum(dout * out)) from x.workspace
// (FailedPrecondition when it is null). Deterministic: no atomics (one block owns each dk/dv
// tile and loops over its query heads).
absl::Status AttentionBackward(const CudaExec& x, DType dtype, void* dq, void* dk, void* dv,
                               const void* dout, const void* out, const float* lse, const void* q,
                               const void* k, const void* v, int b, int t, int nh, int nkv, int hs);

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_OPS_ATTENTION_CUDA_H_
