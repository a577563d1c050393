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
  q_rstd.resize(n * d.nh);
  k_rstd.resize(n * d.nkv);
  q.resize(n * d.nh * d.hs);
  k.resize(n * d.nkv * d.hs);
  v.resize(n * d.nkv * d.hs);
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
  dv.resize(n * d.nkv * d.hs);
  dk_normed.resize(n * d.nkv * d.hs);
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
void AttentionLayerForward(T* out, AttentionActs<T>* acts, const T* x,
                           const AttentionWeights<T>& w, const AttentionDims& d, const T* cos,
                           const T* sin, AttentionScratch<T>* s, core::ThreadPool* pool) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  CheckStacked(w, d);
  cpu::MatmulForward(s->qkv.data(), x, w.wq, n, qd + 2 * kd, d.c, pool);
  SplitQkv(acts->q_raw.data(), acts->k_raw.data(), acts->v.data(), s->qkv.data(), n, qd, kd,
           pool);
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
  cpu::AttentionForward(acts->att.data(), acts->probs.data(), acts->q.data(), acts->k.data(),
                        acts->v.data(), d.b, d.t, d.nh, d.nkv, d.hs, pool);
  cpu::MatmulForward(out, acts->att.data(), w.wo, n, d.c, qd, pool);
}

template <typename T>
void AttentionLayerBackward(T* dx, const AttentionWeights<T>& g, const T* dout,
                            const AttentionActs<T>& acts, const T* x, const AttentionWeights<T>& w,
                            const AttentionDims& d, const T* cos, const T* sin,
                            AttentionScratch<T>* s, core::ThreadPool* pool) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  std::fill(s->datt.begin(), s->datt.end(), T(0));
  cpu::MatmulBackward(s->datt.data(), g.wo, dout, acts.att.data(), w.wo, n, d.c, qd, pool);
  std::fill(s->dq.begin(), s->dq.end(), T(0));
  std::fill(s->dk.begin(), s->dk.end(), T(0));
  std::fill(s->dv.begin(), s->dv.end(), T(0));
  cpu::AttentionBackward(s->dq.data(), s->dk.data(), s->dv.data(), s->datt.data(),
                         acts.probs.data(), acts.q.data(), acts.k.data(), acts.v.data(), d.b, d.t,
                         d.nh, d.nkv, d.hs, pool);
  cpu::RopeBackward(s->dq.data(), cos, sin, d.b, d.t, d.nh, d.hs, pool);
  cpu::RopeBackward(s->dk.data(), cos, sin, d.b, d.t, d.nkv, d.hs, pool);
  const T* dq_raw = s->dq.data();
  const T* dk_raw = s->dk.data();
  if (d.qk_norm) {
    // The normed gradients go through the per-head norm; reuse datt as dq_raw.
    std::fill(s->datt.begin(), s->datt.end(), T(0));
    cpu::RmsNormBackward(s->datt.data(), g.q_norm, s->dq.data(), acts.q_raw.data(), w.q_norm,
                         acts.q_rstd.data(), n * d.nh, d.hs, pool);
    dq_raw = s->datt.data();
    s->dk_normed.swap(s->dk);
    std::fill(s->dk.begin(), s->dk.end(), T(0));
    cpu::RmsNormBackward(s->dk.data(), g.k_norm, s->dk_normed.data(), acts.k_raw.data(), w.k_norm,
                         acts.k_rstd.data(), n * d.nkv, d.hs, pool);
    dk_raw = s->dk.data();
  }
  CheckStacked(g, d);
  JoinQkv(s->qkv.data(), dq_raw, dk_raw, s->dv.data(), n, qd, kd, pool);
  cpu::MatmulBackward(dx, g.wq, s->qkv.data(), x, w.wq, n, qd + 2 * kd, d.c, pool);
}

template struct AttentionActs<float>;
template struct AttentionActs<double>;
template struct AttentionScratch<float>;
template struct AttentionScratch<double>;
template void AttentionLayerForward<float>(float*, AttentionActs<float>*, const float*,
                                           const AttentionWeights<float>&, const AttentionDims&,
                                           const float*, const float*, AttentionScratch<float>*,
                                           core::ThreadPool*);
template void AttentionLayerForward<double>(double*, AttentionActs<double>*, const double*,
                                            const AttentionWeights<double>&, const AttentionDims&,
                                            const double*, const double*,
                                            AttentionScratch<double>*, core::ThreadPool*);
template void AttentionLayerBackward<float>(float*, const AttentionWeights<float>&, const float*,
                                            const AttentionActs<float>&, const float*,
                                            const AttentionWeights<float>&, const AttentionDims&,
                                            const float*, const float*, AttentionScratch<float>*,
                                            core::ThreadPool*);
template void AttentionLayerBackward<double>(double*, const AttentionWeights<double>&,
                                             const double*, const AttentionActs<double>&,
                                             const double*, const AttentionWeights<double>&,
                                             const AttentionDims&, const double*, const double*,
                                             AttentionScratch<double>*, core::ThreadPool*);

}  // namespace satdar::model
