// model/layers/attention.h: the attention sublayer of a Llama block, from normed inputs to the
// sublayer output a = O Wo^T (MODELS.md section 2), in two stages so a value residual can
// sit between them:
//   Project: Q = xq Wq^T (B,T,NH,HS); K = xk Wk^T, V = xv Wv^T (B,T,NKV,HS)
//            (on the CPU one fused GEMM against the stacked weight when xq == xk == xv; on
//            CUDA always three GEMMs, the device param table aligning each weight to 32)
//   Core:    qk_norm (per-head RMSNorm of Q and K), RoPE on Q and K, causal softmax attention
//            over the given values (V, or V' of a value residual), output projection.
//
// Templated on the backend B (model/backend.h): the same functions run on Cpu<float|double>
// (the reference, bit for bit what the CPU model always computed) and, in CUDA builds, on
// Cuda<float|__nv_bfloat16> (what the GPU decoder computed). Every function takes the
// execution context first and returns the first failure of an op. The one difference of
// state: the CPU keeps the softmax probabilities (B,NH,T,T) of T for the backward, CUDA the
// flash attention's log-sum-exp lse (B,NH,T) in fp32 (core/ops/attention_cuda.h).
// Types: activations are B::T; the RMSNorm statistics, the RoPE tables and the weight
// gradients are B::Acc (T on the CPU, fp32 on CUDA).
#ifndef SATDAR_MODEL_LAYERS_ATTENTION_H_
#define SATDAR_MODEL_LAYERS_ATTENTION_H_

#include "absl/status/status.h"
#include "model/backend.h"

namespace satdar::model {

struct AttentionDims {
  int b = 0, t = 0;  // batch, sequence
  int c = 0;         // hidden size
  int nh = 0, nkv = 0, hs = 0;
  bool qk_norm = true;
  double eps = 1e-6;
  int rows() const { return b * t; }
};

// The weights (U = B::T, read from Weights<B>::compute) or their gradients (U = B::Acc).
// On the CPU, with one input, the projections run as one GEMM against the stacked weight:
// REQUIRES there wk == wq + NH*HS*C and wv == wk + NKV*HS*C (the CPU param table stores q, k
// and v back to back).
template <typename U>
struct AttentionWeights {
  U* wq = nullptr;      // (NH*HS, C)
  U* wk = nullptr;      // (NKV*HS, C)
  U* wv = nullptr;      // (NKV*HS, C)
  U* wo = nullptr;      // (C, NH*HS)
  U* q_norm = nullptr;  // (HS), only with qk_norm
  U* k_norm = nullptr;  // (HS)
};

// Saved activations of one attention sublayer.
template <class B>
struct AttentionActs {
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  Vec<T> q_raw, k_raw, v;  // projections (B*T, NH*HS), (B*T, NKV*HS), (B*T, NKV*HS)
  Vec<Acc> q_rstd, k_rstd; // (B*T*NH), (B*T*NKV)
  Vec<T> q, k;             // what attention reads (normed, rotated)
  Vec<T> probs;            // CPU: (B,NH,T,T); empty on CUDA
  Vec<float> lse;          // CUDA: (B,NH,T) fp32; empty on the CPU
  Vec<T> att;              // attention output before Wo (B*T, NH*HS)
  // for_backward false (decoding, AttentionDecodeForward): no probs or lse.
  void Resize(const AttentionDims& d, bool for_backward = true);
};

// Transient buffers shared by every layer of a model.
template <class B>
struct AttentionScratch {
  using T = typename B::T;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  Vec<T> qkv;             // CPU: (B*T, (NH+2*NKV)*HS) fused projection output or gradient
  Vec<T> datt;            // (B*T, NH*HS)
  Vec<T> dq, dk;          // d/d(q, k) as attention read them
  Vec<T> dq_raw, dk_raw;  // d/d(raw projections)
  Vec<T> dv;              // d/d(the values attention read) (B*T, NKV*HS)
  void Resize(const AttentionDims& d);
};

template <class B>
absl::Status AttentionProjectForward(const typename B::Exec& x, AttentionActs<B>* acts,
                                     const typename B::T* xq, const typename B::T* xk,
                                     const typename B::T* xv,
                                     const AttentionWeights<typename B::T>& w,
                                     const AttentionDims& d, AttentionScratch<B>* scratch);

// out (B*T, C); v (B*T, NKV*HS): the values attention reads (acts->v or a mixed V').
// cos, sin: the RoPE tables (T, HS/2) (core/ops/rope.h RopeTables).
template <class B>
absl::Status AttentionCoreForward(const typename B::Exec& x, typename B::T* out,
                                  AttentionActs<B>* acts, const typename B::T* v,
                                  const AttentionWeights<typename B::T>& w,
                                  const AttentionDims& d, const typename B::Acc* cos,
                                  const typename B::Acc* sin);

// Core over a KV cache, for inference (nothing kept for a backward; acts->probs and acts->lse
// are not used): d.t = tn new positions of every sequence at past..past+tn-1, their raw
// projections in acts (AttentionProjectForward with the same d) and v (B*TN, NKV*HS) the
// values they offer. cos, sin: the RoPE tables from position `past` on (TN, HS/2).
// kcache, vcache (B, CAP, NKV*HS): the rotated keys and the values of positions [0, past) on
// entry; the new ones are written at rows past.. first (REQUIRES past + tn <= cap). With
// past = 0 the attention is AttentionCoreForward's, bit for bit (core/ops/attention.h).
template <class B>
absl::Status AttentionDecodeForward(const typename B::Exec& x, typename B::T* out,
                                    AttentionActs<B>* acts, const typename B::T* v,
                                    const AttentionWeights<typename B::T>& w,
                                    const AttentionDims& d, const typename B::Acc* cos,
                                    const typename B::Acc* sin, typename B::T* kcache,
                                    typename B::T* vcache, int past, int cap);

// From dout (B*T, C) to scratch->dq_raw, scratch->dk_raw and scratch->dv (all overwritten);
// weight gradients += into g.
template <class B>
absl::Status AttentionCoreBackward(const typename B::Exec& x,
                                   const AttentionWeights<typename B::Acc>& g,
                                   const typename B::T* dout, const AttentionActs<B>& acts,
                                   const typename B::T* v,
                                   const AttentionWeights<typename B::T>& w,
                                   const AttentionDims& d, const typename B::Acc* cos,
                                   const typename B::Acc* sin, AttentionScratch<B>* scratch);

// From scratch->dq_raw, scratch->dk_raw and dv (d/d raw V) to dxq, dxk, dxv (+=; they may
// alias, and must when xq == xk == xv); weight gradients += into g.
template <class B>
absl::Status AttentionProjectBackward(const typename B::Exec& x, typename B::T* dxq,
                                      typename B::T* dxk, typename B::T* dxv,
                                      const AttentionWeights<typename B::Acc>& g,
                                      const typename B::T* dv, const typename B::T* xq,
                                      const typename B::T* xk, const typename B::T* xv,
                                      const AttentionWeights<typename B::T>& w,
                                      const AttentionDims& d, AttentionScratch<B>* scratch);

// Both stages with one input and no value residual: out = attention sublayer of x.
template <class B>
absl::Status AttentionLayerForward(const typename B::Exec& x, typename B::T* out,
                                   AttentionActs<B>* acts, const typename B::T* in,
                                   const AttentionWeights<typename B::T>& w,
                                   const AttentionDims& d, const typename B::Acc* cos,
                                   const typename B::Acc* sin, AttentionScratch<B>* scratch);

// dx (B*T, C) += d/dx; weight gradients += into g.
template <class B>
absl::Status AttentionLayerBackward(const typename B::Exec& x, typename B::T* dx,
                                    const AttentionWeights<typename B::Acc>& g,
                                    const typename B::T* dout, const AttentionActs<B>& acts,
                                    const typename B::T* in,
                                    const AttentionWeights<typename B::T>& w,
                                    const AttentionDims& d, const typename B::Acc* cos,
                                    const typename B::Acc* sin, AttentionScratch<B>* scratch);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYERS_ATTENTION_H_
