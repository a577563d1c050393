#include "model/layers/attention.h"

#include <algorithm>

#include "core/check.h"
#include "core/ops/attention.h"
#include "core/ops/matmul.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"

namespace satdar::model {

namespace cpu = core::cpu;

template <typename T>
void AttentionActs<T>::Resize(const AttentionDims& d) {
  size_t n = d.rows();
  q_raw.resize(n * d.nh * d.hs);
  k_raw.resize(n * d.nkv * d.hs);
  v.resize(n * d.nkv * d.hs);
  q_rstd.resize(n * d.nh);
  k_rstd.resize(n * d.nkv);
  q.resize(n * d.nh * d.hs);
  k.resize(n * d.nkv * d.hs);
  probs.resize(static_cast<size_t>(d.b) * d.nh * d.t * d.t);
  att.resize(n * d.nh * d.hs);
}

template <typename T>
void AttentionScratch<T>::Resize(const AttentionDims& d) {
  size_t n = d.rows();
  qkv.resize(n * (d.nh + 2 * d.nkv) * d.hs);
  datt.resize(n * d.nh * d.hs);
  dq.resize(n * d.nh * d.hs);
  dk.resize(n * d.nkv * d.hs);
  dq_raw.resize(n * d.nh * d.hs);
  dk_raw.resize(n * d.nkv * d.hs);
  dv.resize(n * d.nkv * d.hs);
}

namespace {

// Rows of (B*T, qd + 2 kd) <-> three contiguous (B*T, qd), (B*T, kd), (B*T, kd) arrays.
template <typename T>
void SplitQkv(T* q, T* k, T* v, const T* qkv, int n, int qd, int kd, core::ThreadPool* pool) {
  const int64_t w = qd + 2 * kd;
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* src = qkv + r * w;
          std::copy(src, src + qd, q + r * qd);
          std::copy(src + qd, src + qd + kd, k + r * kd);
          std::copy(src + qd + kd, src + w, v + r * kd);
        }
      },
      64);
}

template <typename T>
void JoinQkv(T* qkv, const T* q, const T* k, const T* v, int n, int qd, int kd,
             core::ThreadPool* pool) {
  const int64_t w = qd + 2 * kd;
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* dst = qkv + r * w;
          std::copy(q + r * qd, q + (r + 1) * qd, dst);
          std::copy(k + r * kd, k + (r + 1) * kd, dst + qd);
          std::copy(v + r * kd, v + (r + 1) * kd, dst + qd + kd);
        }
      },
      64);
}

template <typename T>
void CheckStacked(const AttentionWeights<T>& w, const AttentionDims& d) {
  const int64_t qsize = static_cast<int64_t>(d.nh) * d.hs * d.c;
  const int64_t ksize = static_cast<int64_t>(d.nkv) * d.hs * d.c;
  SATDAR_CHECK(w.wk == w.wq + qsize && w.wv == w.wk + ksize) << "q/k/v weights not stacked";
}

}  // namespace

template <typename T>
void AttentionProjectForward(AttentionActs<T>* acts, const T* xq, const T* xk, const T* xv,
                             const AttentionWeights<T>& w, const AttentionDims& d,
                             AttentionScratch<T>* s, core::ThreadPool* pool) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  if (xq == xk && xk == xv) {
    CheckStacked(w, d);
    cpu::MatmulForward(s->qkv.data(), xq, w.wq, n, qd + 2 * kd, d.c, pool);
    SplitQkv(acts->q_raw.data(), acts->k_raw.data(), acts->v.data(), s->qkv.data(), n, qd, kd,
             pool);
  } else {
    cpu::MatmulForward(acts->q_raw.data(), xq, w.wq, n, qd, d.c, pool);
    cpu::MatmulForward(acts->k_raw.data(), xk, w.wk, n, kd, d.c, pool);
    cpu::MatmulForward(acts->v.data(), xv, w.wv, n, kd, d.c, pool);
  }
}

template <typename T>
void AttentionCoreForward(T* out, AttentionActs<T>* acts, const T* v, const AttentionWeights<T>& w,
                          const AttentionDims& d, const T* cos, const T* sin,
                          core::ThreadPool* pool) {
  const int n = d.rows(), qd = d.nh * d.hs;
  if (d.qk_norm) {
    cpu::RmsNormForward(acts->q.data(), acts->q_rstd.data(), acts->q_raw.data(), w.q_norm,
                        n * d.nh, d.hs, d.eps, pool);
    cpu::RmsNormForward(acts->k.data(), acts->k_rstd.data(), acts->k_raw.data(), w.k_norm,
                        n * d.nkv, d.hs, d.eps, pool);
  } else {
    std::copy(acts->q_raw.begin(), acts->q_raw.end(), acts->q.begin());
    std::copy(acts->k_raw.begin(), acts->k_raw.end(), acts->k.begin());
  }
  cpu::RopeForward(acts->q.data(), cos, sin, d.b, d.t, d.nh, d.hs, pool);
  cpu::RopeForward(acts->k.data(), cos, sin, d.b, d.t, d.nkv, d.hs, pool);
  cpu::AttentionForward(acts->att.data(), acts->probs.data(), acts->q.data(), acts->k.data(), v,
                        d.b, d.t, d.nh, d.nkv, d.hs, pool);
  cpu::MatmulForward(out, acts->att.data(), w.wo, n, d.c, qd, pool);
}

template <typename T>
void AttentionCoreBackward(const AttentionWeights<T>& g, const T* dout, const AttentionActs<T>& acts,
                           const T* v, const AttentionWeights<T>& w, const AttentionDims& d,
                           const T* cos, const T* sin, AttentionScratch<T>* s,
                           core::ThreadPool* pool) {
  const int n = d.rows(), qd = d.nh * d.hs;
  std::fill(s->datt.begin(), s->datt.end(), T(0));
  cpu::MatmulBackward(s->datt.data(), g.wo, dout, acts.att.data(), w.wo, n, d.c, qd, pool);
  std::fill(s->dq.begin(), s->dq.end(), T(0));
  std::fill(s->dk.begin(), s->dk.end(), T(0));
  std::fill(s->dv.begin(), s->dv.end(), T(0));
  cpu::AttentionBackward(s->dq.data(), s->dk.data(), s->dv.data(), s->datt.data(),
                         acts.probs.data(), acts.q.data(), acts.k.data(), v, d.b, d.t, d.nh,
                         d.nkv, d.hs, pool);
  cpu::RopeBackward(s->dq.data(), cos, sin, d.b, d.t, d.nh, d.hs, pool);
  cpu::RopeBackward(s->dk.data(), cos, sin, d.b, d.t, d.nkv, d.hs, pool);
  if (d.qk_norm) {
    std::fill(s->dq_raw.begin(), s->dq_raw.end(), T(0));
    std::fill(s->dk_raw.begin(), s->dk_raw.end(), T(0));
    cpu::RmsNormBackward(s->dq_raw.data(), g.q_norm, s->dq.data(), acts.q_raw.data(), w.q_norm,
                         acts.q_rstd.data(), n * d.nh, d.hs, pool);
    cpu::RmsNormBackward(s->dk_raw.data(), g.k_norm, s->dk.data(), acts.k_raw.data(), w.k_norm,
                         acts.k_rstd.data(), n * d.nkv, d.hs, pool);
  } else {
    std::copy(s->dq.begin(), s->dq.end(), s->dq_raw.begin());
    std::copy(s->dk.begin(), s->dk.end(), s->dk_raw.begin());
  }
}

template <typename T>
void AttentionProjectBackward(T* dxq, T* dxk, T* dxv, const AttentionWeights<T>& g, const T* dv,
                              const T* xq, const T* xk, const T* xv, const AttentionWeights<T>& w,
                              const AttentionDims& d, AttentionScratch<T>* s,
                              core::ThreadPool* pool) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  if (xq == xk && xk == xv) {
    SATDAR_CHECK(dxq == dxk && dxk == dxv) << "one input needs one gradient";
    CheckStacked(g, d);
    JoinQkv(s->qkv.data(), s->dq_raw.data(), s->dk_raw.data(), dv, n, qd, kd, pool);
    cpu::MatmulBackward(dxq, g.wq, s->qkv.data(), xq, w.wq, n, qd + 2 * kd, d.c, pool);
  } else {
    cpu::MatmulBackward(dxq, g.wq, s->dq_raw.data(), xq, w.wq, n, qd, d.c, pool);
    cpu::MatmulBackward(dxk, g.wk, s->dk_raw.data(), xk, w.wk, n, kd, d.c, pool);
    cpu::MatmulBackward(dxv, g.wv, dv, xv, w.wv, n, kd, d.c, pool);
  }
}

template <typename T>
void AttentionLayerForward(T* out, AttentionActs<T>* acts, const T* x,
                           const AttentionWeights<T>& w, const AttentionDims& d, const T* cos,
                           const T* sin, AttentionScratch<T>* s, core::ThreadPool* pool) {
  AttentionProjectForward(acts, x, x, x, w, d, s, pool);
  AttentionCoreForward(out, acts, acts->v.data(), w, d, cos, sin, pool);
}

template <typename T>
void AttentionLayerBackward(T* dx, const AttentionWeights<T>& g, const T* dout,
                            const AttentionActs<T>& acts, const T* x, const AttentionWeights<T>& w,
                            const AttentionDims& d, const T* cos, const T* sin,
                            AttentionScratch<T>* s, core::ThreadPool* pool) {
  AttentionCoreBackward(g, dout, acts, acts.v.data(), w, d, cos, sin, s, pool);
  AttentionProjectBackward(dx, dx, dx, g, s->dv.data(), x, x, x, w, d, s, pool);
}

#define SATDAR_INSTANTIATE(T)                                                                   \
  template struct AttentionActs<T>;                                                             \
  template struct AttentionScratch<T>;                                                          \
  template void AttentionProjectForward<T>(AttentionActs<T>*, const T*, const T*, const T*,     \
                                           const AttentionWeights<T>&, const AttentionDims&,    \
                                           AttentionScratch<T>*, core::ThreadPool*);            \
  template void AttentionCoreForward<T>(T*, AttentionActs<T>*, const T*,                        \
                                        const AttentionWeights<T>&, const AttentionDims&,       \
                                        const T*, const T*, core::ThreadPool*);                 \
  template void AttentionCoreBackward<T>(const AttentionWeights<T>&, const T*,                  \
                                         const AttentionActs<T>&, const T*,                     \
                                         const AttentionWeights<T>&, const AttentionDims&,      \
                                         const T*, const T*, AttentionScratch<T>*,              \
                                         core::ThreadPool*);                                    \
  template void AttentionProjectBackward<T>(T*, T*, T*, const AttentionWeights<T>&, const T*,   \
                                            const T*, const T*, const T*,                       \
                                            const AttentionWeights<T>&, const AttentionDims&,   \
                                            AttentionScratch<T>*, core::ThreadPool*);           \
  template void AttentionLayerForward<T>(T*, AttentionActs<T>*, const T*,                       \
                                         const AttentionWeights<T>&, const AttentionDims&,      \
                                         const T*, const T*, AttentionScratch<T>*,              \
                                         core::ThreadPool*);                                    \
  template void AttentionLayerBackward<T>(T*, const AttentionWeights<T>&, const T*,             \
                                          const AttentionActs<T>&, const T*,                    \
                                          const AttentionWeights<T>&, const AttentionDims&,     \
                                          const T*, const T*, AttentionScratch<T>*,             \
                                          core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model
