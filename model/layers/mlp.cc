#include "model/layers/mlp.h"

#include <algorithm>

#include "core/check.h"
#include "core/ops/matmul.h"
#include "core/ops/swiglu.h"

namespace satdar::model {

namespace cpu = core::cpu;

template <typename T>
void MlpActs<T>::Resize(const MlpDims& d) {
  size_t n = static_cast<size_t>(d.rows) * d.f;
  gate_up.resize(2 * n);
  act.resize(n);
}

template <typename T>
void MlpScratch<T>::Resize(const MlpDims& d) {
  size_t n = static_cast<size_t>(d.rows) * d.f;
  dact.resize(n);
  dgate_up.resize(2 * n);
}

template <typename T>
void MlpForward(T* out, MlpActs<T>* acts, const T* z, const MlpWeights<T>& w, const MlpDims& d,
                core::ThreadPool* pool) {
  SATDAR_CHECK(w.up == w.gate + static_cast<int64_t>(d.f) * d.c) << "gate/up not stacked";
  cpu::MatmulForward(acts->gate_up.data(), z, w.gate, d.rows, 2 * d.f, d.c, pool);
  cpu::SwigluForward(acts->act.data(), acts->gate_up.data(), d.rows, d.f, pool);
  cpu::MatmulForward(out, acts->act.data(), w.down, d.rows, d.c, d.f, pool);
}

template <typename T>
void MlpBackward(T* dz, const MlpWeights<T>& g, const T* dout, const MlpActs<T>& acts, const T* z,
                 const MlpWeights<T>& w, const MlpDims& d, MlpScratch<T>* s,
                 core::ThreadPool* pool) {
  std::fill(s->dact.begin(), s->dact.end(), T(0));
  cpu::MatmulBackward(s->dact.data(), g.down, dout, acts.act.data(), w.down, d.rows, d.c, d.f,
                      pool);
  cpu::SwigluBackward(s->dgate_up.data(), s->dact.data(), acts.gate_up.data(), d.rows, d.f, pool);
  SATDAR_CHECK(g.up == g.gate + static_cast<int64_t>(d.f) * d.c) << "gate/up grads not stacked";
  cpu::MatmulBackward(dz, g.gate, s->dgate_up.data(), z, w.gate, d.rows, 2 * d.f, d.c, pool);
}

template struct MlpActs<float>;
template struct MlpActs<double>;
template struct MlpScratch<float>;
template struct MlpScratch<double>;
template void MlpForward<float>(float*, MlpActs<float>*, const float*, const MlpWeights<float>&,
                                const MlpDims&, core::ThreadPool*);
template void MlpForward<double>(double*, MlpActs<double>*, const double*,
                                 const MlpWeights<double>&, const MlpDims&, core::ThreadPool*);
template void MlpBackward<float>(float*, const MlpWeights<float>&, const float*,
                                 const MlpActs<float>&, const float*, const MlpWeights<float>&,
                                 const MlpDims&, MlpScratch<float>*, core::ThreadPool*);
template void MlpBackward<double>(double*, const MlpWeights<double>&, const double*,
                                  const MlpActs<double>&, const double*,
                                  const MlpWeights<double>&, const MlpDims&, MlpScratch<double>*,
                                  core::ThreadPool*);

}  // namespace satdar::model
