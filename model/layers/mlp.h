// model/layers/mlp.h: the SwiGLU MLP sublayer, m = Wdown (silu(Wgate z) * (Wup z)).
//
// Templated on the backend B (model/backend.h) like attention.h: Cpu<float|double> computes
// what the CPU model always did, bit for bit; Cuda<float|__nv_bfloat16> (CUDA builds) what the
// GPU decoder did, with fp32 weight gradients (B::Acc) from the mixed-precision GEMM forms.
// The functions take the execution context first and return the first failure of an op.
#ifndef SATDAR_MODEL_LAYERS_MLP_H_
#define SATDAR_MODEL_LAYERS_MLP_H_

#include "absl/status/status.h"
#include "model/backend.h"

namespace satdar::model {

struct MlpDims {
  int rows = 0;  // B*T
  int c = 0;     // hidden size
  int f = 0;     // intermediate size
};

// The weights (U = B::T, from Weights<B>::compute) or their gradients (U = B::Acc).
// REQUIRES: up == gate + F*C (the param table stores gate_proj and up_proj back to back), so
// both projections run as one GEMM against the stacked (2F, C) weight.
template <typename U>
struct MlpWeights {
  U* gate = nullptr;  // (F, C)
  U* up = nullptr;    // (F, C)
  U* down = nullptr;  // (C, F)
};

template <class B>
struct MlpActs {
  typename B::template Vec<typename B::T> gate_up;  // (B*T, 2F): [gate | up] per row
  typename B::template Vec<typename B::T> act;      // (B*T, F)
  void Resize(const MlpDims& d);
};

template <class B>
struct MlpScratch {
  typename B::template Vec<typename B::T> dact;      // (B*T, F)
  typename B::template Vec<typename B::T> dgate_up;  // (B*T, 2F)
  void Resize(const MlpDims& d);
};

// out (B*T, C) = MLP of z (B*T, C).
template <class B>
absl::Status MlpForward(const typename B::Exec& x, typename B::T* out, MlpActs<B>* acts,
                        const typename B::T* z, const MlpWeights<typename B::T>& w,
                        const MlpDims& d);

// dz (B*T, C) +=; weight gradients += into g.
template <class B>
absl::Status MlpBackward(const typename B::Exec& x, typename B::T* dz,
                         const MlpWeights<typename B::Acc>& g, const typename B::T* dout,
                         const MlpActs<B>& acts, const typename B::T* z,
                         const MlpWeights<typename B::T>& w, const MlpDims& d,
                         MlpScratch<B>* scratch);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYERS_MLP_H_
