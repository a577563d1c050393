// model/layers/attention.h: the attention sublayer of a Llama block, from normed inputs to the
// sublayer output a = O Wo^T (MODELS.md section 2), in two stages so a value residual can
// sit between them:
//   Project: Q = xq Wq^T (B,T,NH,HS); K = xk Wk^T, V = xv Wv^T (B,T,NKV,HS)
//            (one fused GEMM against the stacked weight when xq == xk == xv)
//   Core:    qk_norm (per-head RMSNorm of Q and K), RoPE on Q and K, causal softmax attention
//            over the given values (V, or V' of a value residual), output projection.
#ifndef SATDAR_MODEL_LAYERS_ATTENTION_H_
#define SATDAR_MODEL_LAYERS_ATTENTION_H_

#include <vector>

#include "core/thread_pool.h"

namespace satdar::model {

struct AttentionDims {
  int b = 0, t = 0;  // batch, sequence
  int c = 0;         // hidden size
  int nh = 0, nkv = 0, hs = 0;
  bool qk_norm = true;
  double eps = 1e-6;
  int rows() const { return b * t; }
};

// REQUIRES: wk == wq + NH*HS*C and wv == wk + NKV*HS*C (the param table stores q, k and v
// back to back), so the three projections can run as one GEMM against the stacked weight.
template <typename T>
struct AttentionWeights {
  T* wq = nullptr;      // (NH*HS, C)
  T* wk = nullptr;      // (NKV*HS, C)
  T* wv = nullptr;      // (NKV*HS, C)
  T* wo = nullptr;      // (C, NH*HS)
  T* q_norm = nullptr;  // (HS), only with qk_norm
  T* k_norm = nullptr;  // (HS)
};

// Saved activations of one attention sublayer.
template <typename T>
struct AttentionActs {
  std::vector<T> q_raw, k_raw, v;  // projections (B*T, NH*HS), (B*T, NKV*HS), (B*T, NKV*HS)
  std::vector<T> q_rstd, k_rstd;   // (B*T*NH), (B*T*NKV)
  std::vector<T> q, k;             // what attention reads (normed, rotated)
  std::vector<T> probs;            // (B,NH,T,T)
  std::vector<T> att;              // attention output before Wo (B*T, NH*HS)
  void Resize(const AttentionDims& d);
};

// Transient buffers shared by every layer of a model.
template <typename T>
struct AttentionScratch {
  std::vector<T> qkv;             // (B*T, (NH+2*NKV)*HS): fused projection output or gradient
  std::vector<T> datt;            // (B*T, NH*HS)
  std::vector<T> dq, dk;          // d/d(q, k) as attention read them
  std::vector<T> dq_raw, dk_raw;  // d/d(raw projections)
  std::vector<T> dv;              // d/d(the values attention read) (B*T, NKV*HS)
  void Resize(const AttentionDims& d);
};

template <typename T>
void AttentionProjectForward(AttentionActs<T>* acts, const T* xq, const T* xk, const T* xv,
                             const AttentionWeights<T>& w, const AttentionDims& d,
                             AttentionScratch<T>* scratch, core::ThreadPool* pool);

// out (B*T, C); v (B*T, NKV*HS): the values attention reads (acts->v or a mixed V').
template <typename T>
void AttentionCoreForward(T* out, AttentionActs<T>* acts, const T* v, const AttentionWeights<T>& w,
                          const AttentionDims& d, const T* cos, const T* sin,
                          core::ThreadPool* pool);

// From dout (B*T, C) to scratch->dq_raw, scratch->dk_raw and scratch->dv (all overwritten);
// weight gradients += into g.
template <typename T>
void AttentionCoreBackward(const AttentionWeights<T>& g, const T* dout, const AttentionActs<T>& acts,
                           const T* v, const AttentionWeights<T>& w, const AttentionDims& d,
                           const T* cos, const T* sin, AttentionScratch<T>* scratch,
                           core::ThreadPool* pool);

// From scratch->dq_raw, scratch->dk_raw and dv (d/d raw V) to dxq, dxk, dxv (+=; they may
// alias, and must when xq == xk == xv); weight gradients += into g.
template <typename T>
void AttentionProjectBackward(T* dxq, T* dxk, T* dxv, const AttentionWeights<T>& g, const T* dv,
                              const T* xq, const T* xk, const T* xv, const AttentionWeights<T>& w,
                              const AttentionDims& d, AttentionScratch<T>* scratch,
                              core::ThreadPool* pool);

// Both stages with one input and no value residual: out = attention sublayer of x.
template <typename T>
void AttentionLayerForward(T* out, AttentionActs<T>* acts, const T* x,
                           const AttentionWeights<T>& w, const AttentionDims& d, const T* cos,
                           const T* sin, AttentionScratch<T>* scratch, core::ThreadPool* pool);

// dx (B*T, C) += d/dx; weight gradients += into g.
template <typename T>
void AttentionLayerBackward(T* dx, const AttentionWeights<T>& g, const T* dout,
                            const AttentionActs<T>& acts, const T* x, const AttentionWeights<T>& w,
                            const AttentionDims& d, const T* cos, const T* sin,
                            AttentionScratch<T>* scratch, core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYERS_ATTENTION_H_
