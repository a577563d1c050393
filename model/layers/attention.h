// model/layers/attention.h: the attention sublayer of a Llama block, from the normed input x
// to the sublayer output a = O Wo^T (MODELS.md section 2):
//   Q = x Wq^T (B,T,NH,HS); K = x Wk^T, V = x Wv^T (B,T,NKV,HS)
//   qk_norm: per-head RMSNorm of Q and K; RoPE on Q and K; causal softmax attention (GQA).
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
// back to back), so the three projections run as one GEMM against the stacked weight.
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
  std::vector<T> q_raw, k_raw;    // projections before qk_norm (B*T*NH*HS), (B*T*NKV*HS)
  std::vector<T> q_rstd, k_rstd;  // (B*T*NH), (B*T*NKV)
  std::vector<T> q, k, v;         // what attention reads (normed, rotated)
  std::vector<T> probs;           // (B,NH,T,T)
  std::vector<T> att;             // attention output before Wo (B*T, NH*HS)
  void Resize(const AttentionDims& d);
};

// Shared transient buffers (one per model).
template <typename T>
struct AttentionScratch {
  std::vector<T> qkv;  // (B*T, (NH+2*NKV)*HS): fused projection output, or its gradient
  std::vector<T> datt, dq, dk, dv, dk_normed;
  void Resize(const AttentionDims& d);
};

// out (B*T, C) = attention sublayer of x (B*T, C).
template <typename T>
void AttentionLayerForward(T* out, AttentionActs<T>* acts, const T* x,
                           const AttentionWeights<T>& w, const AttentionDims& d, const T* cos,
                           const T* sin, AttentionScratch<T>* scratch, core::ThreadPool* pool);

// dx (B*T, C) += d/dx; weight gradients += into g. dout (B*T, C) is d loss / d out.
template <typename T>
void AttentionLayerBackward(T* dx, const AttentionWeights<T>& g, const T* dout,
                            const AttentionActs<T>& acts, const T* x, const AttentionWeights<T>& w,
                            const AttentionDims& d, const T* cos, const T* sin,
                            AttentionScratch<T>* scratch, core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYERS_ATTENTION_H_
