// core/ops/attention.h: causal softmax attention with grouped KV heads (GQA).
// Query head h reads KV head h / (NH/NKV). Scale 1/sqrt(HS).
#ifndef SATDAR_CORE_OPS_ATTENTION_H_
#define SATDAR_CORE_OPS_ATTENTION_H_

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// out (B,T,NH,HS); probs (B,NH,T,T) saved for backward (upper triangle is zero);
// q (B,T,NH,HS), k and v (B,T,NKV,HS).
template <typename T>
void AttentionForward(T* out, T* probs, const T* q, const T* k, const T* v, int b, int t, int nh,
                      int nkv, int hs, ThreadPool* pool);

// Inference over a KV cache (nothing saved for a backward): tn new queries at positions
// past..past+tn-1 of every sequence. q and out (B,TN,NH,HS); k and v (B,CAP,NKV,HS) with rows
// [0, past+tn) filled (the new keys and values already written at past..). Query i reads keys
// j <= past+i. With past = 0 and tn = cap = t: AttentionForward's out, bit for bit.
template <typename T>
void AttentionCachedForward(T* out, const T* q, const T* k, const T* v, int b, int tn, int past,
                            int cap, int nh, int nkv, int hs, ThreadPool* pool);

// dq (B,T,NH,HS), dk and dv (B,T,NKV,HS): all accumulated (+=).
template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* probs, const T* q, const T* k,
                       const T* v, int b, int t, int nh, int nkv, int hs, ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_ATTENTION_H_
