#include "model/layers/mlp.h"

#include <algorithm>

#include "core/ops/matmul.h"
#include "core/ops/swiglu.h"

namespace satdar::model {

namespace cpu = core::cpu;

template <typename T>
void MlpActs<T>::Resize(const MlpDims& d) {
  size_t n = static_cast<size_t>(d.rows) * d.f;
  gate.resize(n);
  up.resize(n);
  act.resize(n);
}

template <typename T>
void MlpScratch<T>::Resize(const MlpDims& d) {
  size_t n = static_cast<size_t>(d.rows) * d.f;
  dact.resize(n);
  dgate.resize(n);
  dup.resize(n);
}

template <typename T>
void MlpForward(T* out, MlpActs<T>* acts, const T* z, const MlpWeights<T>& w, const MlpDims& d,
                core::ThreadPool* pool) {
  cpu::MatmulForward(acts->gate.data(), z, w.gate, d.rows, d.f, d.c, pool);
  cpu::MatmulForward(acts->up.data(), z, w.up, d.rows, d.f, d.c, pool);
  cpu::SwigluForward(acts->act.data(), acts->gate.data(), acts->up.data(),
                     static_cast<int64_t>(d.rows) * d.f, pool);
  cpu::MatmulForward(out, acts->act.data(), w.down, d.rows, d.c, d.f, pool);
}

template <typename T>
void MlpBackward(T* dz, const MlpWeights<T>& g, const T* dout, const MlpActs<T>& acts, const T* z,
                 const MlpWeights<T>& w, const MlpDims& d, MlpScratch<T>* s,
                 core::ThreadPool* pool) {
  std::fill(s->dact.begin(), s->dact.end(), T(0));
  cpu::MatmulBackward(s->dact.data(), g.down, dout, acts.act.data(), w.down, d.rows, d.c, d.f,
                      pool);
  cpu::SwigluBackward(s->dgate.data(), s->dup.data(), s->dact.data(), acts.gate.data(),
                      acts.up.data(), static_cast<int64_t>(d.rows) * d.f, pool);
  cpu::MatmulBackward(dz, g.gate, s->dgate.data(), z, w.gate, d.rows, d.f, d.c, pool);
  cpu::MatmulBackward(dz, g.up, s->dup.data(), z, w.up, d.rows, d.f, d.c, pool);
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
