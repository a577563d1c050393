// model/layers/mlp.h: the SwiGLU MLP sublayer, m = Wdown (silu(Wgate z) * (Wup z)).
#ifndef SATDAR_MODEL_LAYERS_MLP_H_
#define SATDAR_MODEL_LAYERS_MLP_H_

#include <vector>

#include "core/thread_pool.h"

namespace satdar::model {

struct MlpDims {
  int rows = 0;  // B*T
  int c = 0;     // hidden size
  int f = 0;     // intermediate size
};

// REQUIRES: up == gate + F*C (the param table stores gate_proj and up_proj back to back), so
// both projections run as one GEMM against the stacked (2F, C) weight.
template <typename T>
struct MlpWeights {
  T* gate = nullptr;  // (F, C)
  T* up = nullptr;    // (F, C)
  T* down = nullptr;  // (C, F)
};

template <typename T>
struct MlpActs {
  std::vector<T> gate_up;  // (B*T, 2F): [gate | up] per row
  std::vector<T> act;      // (B*T, F)
  void Resize(const MlpDims& d);
};

template <typename T>
struct MlpScratch {
  std::vector<T> dact;      // (B*T, F)
  std::vector<T> dgate_up;  // (B*T, 2F)
  void Resize(const MlpDims& d);
};

// out (B*T, C) = MLP of z (B*T, C).
template <typename T>
void MlpForward(T* out, MlpActs<T>* acts, const T* z, const MlpWeights<T>& w, const MlpDims& d,
                core::ThreadPool* pool);

// dz (B*T, C) +=; weight gradients += into g.
template <typename T>
void MlpBackward(T* dz, const MlpWeights<T>& g, const T* dout, const MlpActs<T>& acts, const T* z,
                 const MlpWeights<T>& w, const MlpDims& d, MlpScratch<T>* scratch,
                 core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYERS_MLP_H_
