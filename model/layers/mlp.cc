#include "model/layers/mlp.h"

#include <cstdint>

#include "core/check.h"
#include "model/layers/linear.h"
#include "model/ops.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

using layers_internal::LinearBackward;

template <class B>
void MlpActs<B>::Resize(const MlpDims& d) {
  size_t n = static_cast<size_t>(d.rows) * d.f;
  gate_up.resize(2 * n);
  act.resize(n);
}

template <class B>
void MlpScratch<B>::Resize(const MlpDims& d) {
  size_t n = static_cast<size_t>(d.rows) * d.f;
  dact.resize(n);
  dgate_up.resize(2 * n);
}

template <class B>
absl::Status MlpForward(const typename B::Exec& x, typename B::T* out, MlpActs<B>* acts,
                        const typename B::T* z, const MlpWeights<typename B::T>& w,
                        const MlpDims& d) {
  SATDAR_CHECK(w.up == w.gate + static_cast<int64_t>(d.f) * d.c) << "gate/up not stacked";
  SATDAR_RETURN_IF_ERROR(
      ops::MatmulForward(x, acts->gate_up.data(), z, w.gate, d.rows, 2 * d.f, d.c));
  SATDAR_RETURN_IF_ERROR(
      ops::SwigluForward(x, acts->act.data(), acts->gate_up.data(), d.rows, d.f));
  return ops::MatmulForward(x, out, acts->act.data(), w.down, d.rows, d.c, d.f);
}

template <class B>
absl::Status MlpBackward(const typename B::Exec& x, typename B::T* dz,
                         const MlpWeights<typename B::Acc>& g, const typename B::T* dout,
                         const MlpActs<B>& acts, const typename B::T* z,
                         const MlpWeights<typename B::T>& w, const MlpDims& d,
                         MlpScratch<B>* s) {
  SATDAR_RETURN_IF_ERROR(LinearBackward(x, s->dact.data(), g.down, dout, acts.act.data(), w.down,
                                        d.rows, d.c, d.f, /*overwrite=*/true));
  SATDAR_RETURN_IF_ERROR(ops::SwigluBackward(x, s->dgate_up.data(), s->dact.data(),
                                             acts.gate_up.data(), d.rows, d.f));
  SATDAR_CHECK(g.up == g.gate + static_cast<int64_t>(d.f) * d.c) << "gate/up grads not stacked";
  return LinearBackward(x, dz, g.gate, s->dgate_up.data(), z, w.gate, d.rows, 2 * d.f, d.c,
                        /*overwrite=*/false);
}

#define SATDAR_INSTANTIATE(B)                                                                  \
  template struct MlpActs<B>;                                                                  \
  template struct MlpScratch<B>;                                                               \
  template absl::Status MlpForward<B>(const B::Exec&, B::T*, MlpActs<B>*, const B::T*,         \
                                      const MlpWeights<B::T>&, const MlpDims&);                \
  template absl::Status MlpBackward<B>(const B::Exec&, B::T*, const MlpWeights<B::Acc>&,       \
                                       const B::T*, const MlpActs<B>&, const B::T*,            \
                                       const MlpWeights<B::T>&, const MlpDims&, MlpScratch<B>*);
SATDAR_INSTANTIATE(Cpu<float>)
SATDAR_INSTANTIATE(Cpu<double>)
#if defined(SATDAR_WITH_CUDA)
SATDAR_INSTANTIATE(Cuda<float>)
SATDAR_INSTANTIATE(Cuda<__nv_bfloat16>)
#endif
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model
