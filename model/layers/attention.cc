#include "model/layers/attention.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/dtype.h"
#include "core/ops/attention_cuda.h"
#include "core/thread_pool.h"
#include "model/layers/linear.h"
#include "model/layout_check.h"
#include "model/ops.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

// CheckDeviceSupport refuses configs with a copy of the attention kernel's limit
// (layout_check.h). attention_cuda.h is plain declarations, so this holds in every build.
static_assert(kDeviceMaxHeadSize == core::cuda::kAttentionMaxHeadSize,
              "layout_check.h's kDeviceMaxHeadSize must equal kAttentionMaxHeadSize");

using layers_internal::LinearBackward;

template <class B>
void AttentionActs<B>::Resize(const AttentionDims& d, bool for_backward) {
  size_t n = d.rows();
  q_raw.resize(n * d.nh * d.hs);
  k_raw.resize(n * d.nkv * d.hs);
  v.resize(n * d.nkv * d.hs);
  q_rstd.resize(n * d.nh);
  k_rstd.resize(n * d.nkv);
  q.resize(n * d.nh * d.hs);
  k.resize(n * d.nkv * d.hs);
  if (!for_backward) {
    lse = Vec<float>();
    probs = Vec<T>();
  } else if constexpr (B::kDevice) {
    lse.resize(static_cast<size_t>(d.b) * d.nh * d.t);
  } else {
    probs.resize(static_cast<size_t>(d.b) * d.nh * d.t * d.t);
  }
  att.resize(n * d.nh * d.hs);
}

template <class B>
void AttentionScratch<B>::Resize(const AttentionDims& d) {
  size_t n = d.rows();
  // The fused q/k/v GEMM is the CPU's (see ProjectQkv below).
  if constexpr (!B::kDevice) qkv.resize(n * (d.nh + 2 * d.nkv) * d.hs);
  datt.resize(n * d.nh * d.hs);
  dq.resize(n * d.nh * d.hs);
  dk.resize(n * d.nkv * d.hs);
  dq_raw.resize(n * d.nh * d.hs);
  dk_raw.resize(n * d.nkv * d.hs);
  dv.resize(n * d.nkv * d.hs);
}

namespace {

// The DType of the CUDA attention kernels' void pointers.
template <typename T>
constexpr core::DType KernelDType() {
#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return core::DType::kBF16;
#endif
  return core::DType::kF32;
}

// Rows [0, n) split over x.pool in chunks of `grain` (the calling thread without a pool).
template <typename F>
void ForRows(const core::CpuExec& x, int64_t n, F&& body) {
  if (x.pool == nullptr) {
    body(int64_t{0}, n);
  } else {
    x.pool->ParallelFor(n, body, 64);
  }
}

// Rows of (B*T, qd + 2 kd) <-> three contiguous (B*T, qd), (B*T, kd), (B*T, kd) arrays.
template <typename T>
void SplitQkv(const core::CpuExec& x, T* q, T* k, T* v, const T* qkv, int n, int qd, int kd) {
  const int64_t w = qd + 2 * kd;
  ForRows(x, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* src = qkv + r * w;
      std::copy(src, src + qd, q + r * qd);
      std::copy(src + qd, src + qd + kd, k + r * kd);
      std::copy(src + qd + kd, src + w, v + r * kd);
    }
  });
}

template <typename T>
void JoinQkv(const core::CpuExec& x, T* qkv, const T* q, const T* k, const T* v, int n, int qd,
             int kd) {
  const int64_t w = qd + 2 * kd;
  ForRows(x, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* dst = qkv + r * w;
      std::copy(q + r * qd, q + (r + 1) * qd, dst);
      std::copy(k + r * kd, k + (r + 1) * kd, dst + qd);
      std::copy(v + r * kd, v + (r + 1) * kd, dst + qd + kd);
    }
  });
}

template <typename U>
void CheckStacked(const AttentionWeights<U>& w, const AttentionDims& d) {
  const int64_t qsize = static_cast<int64_t>(d.nh) * d.hs * d.c;
  const int64_t ksize = static_cast<int64_t>(d.nkv) * d.hs * d.c;
  SATDAR_CHECK(w.wk == w.wq + qsize && w.wv == w.wk + ksize) << "q/k/v weights not stacked";
}

// The q/k/v projections and their backward, overloaded on the device like the ops. The CPU
// runs one GEMM against the stacked weight when the three inputs are one buffer (through
// scratch qkv); CUDA always runs three, its param table aligning each weight to 32.
template <typename T>
absl::Status ProjectQkv(const core::CpuExec& x, T* q, T* k, T* v, T* qkv, const T* xq,
                        const T* xk, const T* xv, const AttentionWeights<T>& w,
                        const AttentionDims& d) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  if (xq == xk && xk == xv) {
    CheckStacked(w, d);
    SATDAR_RETURN_IF_ERROR(ops::MatmulForward(x, qkv, xq, w.wq, n, qd + 2 * kd, d.c));
    SplitQkv(x, q, k, v, qkv, n, qd, kd);
  } else {
    SATDAR_RETURN_IF_ERROR(ops::MatmulForward(x, q, xq, w.wq, n, qd, d.c));
    SATDAR_RETURN_IF_ERROR(ops::MatmulForward(x, k, xk, w.wk, n, kd, d.c));
    SATDAR_RETURN_IF_ERROR(ops::MatmulForward(x, v, xv, w.wv, n, kd, d.c));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ProjectQkvBackward(const core::CpuExec& x, T* dxq, T* dxk, T* dxv,
                                const AttentionWeights<T>& g, T* qkv, const T* dq,
                                const T* dk, const T* dv, const T* xq, const T* xk,
                                const T* xv, const AttentionWeights<T>& w,
                                const AttentionDims& d) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  if (xq == xk && xk == xv) {
    SATDAR_CHECK(dxq == dxk && dxk == dxv) << "one input needs one gradient";
    CheckStacked(g, d);
    JoinQkv(x, qkv, dq, dk, dv, n, qd, kd);
    return ops::MatmulBackward(x, dxq, g.wq, qkv, xq, w.wq, n, qd + 2 * kd, d.c);
  }
  SATDAR_RETURN_IF_ERROR(ops::MatmulBackward(x, dxq, g.wq, dq, xq, w.wq, n, qd, d.c));
  SATDAR_RETURN_IF_ERROR(ops::MatmulBackward(x, dxk, g.wk, dk, xk, w.wk, n, kd, d.c));
  return ops::MatmulBackward(x, dxv, g.wv, dv, xv, w.wv, n, kd, d.c);
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
template <typename T>
absl::Status ProjectQkv(const core::CudaExec& x, T* q, T* k, T* v, T* qkv, const T* xq,
                        const T* xk, const T* xv, const AttentionWeights<T>& w,
                        const AttentionDims& d) {
  (void)qkv;
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  SATDAR_RETURN_IF_ERROR(ops::MatmulForward(x, q, xq, w.wq, n, qd, d.c));
  SATDAR_RETURN_IF_ERROR(ops::MatmulForward(x, k, xk, w.wk, n, kd, d.c));
  return ops::MatmulForward(x, v, xv, w.wv, n, kd, d.c);
}

template <typename T>
absl::Status ProjectQkvBackward(const core::CudaExec& x, T* dxq, T* dxk, T* dxv,
                                const AttentionWeights<float>& g, T* qkv, const T* dq,
                                const T* dk, const T* dv, const T* xq, const T* xk,
                                const T* xv, const AttentionWeights<T>& w,
                                const AttentionDims& d) {
  (void)qkv;
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  SATDAR_RETURN_IF_ERROR(LinearBackward(x, dxq, g.wq, dq, xq, w.wq, n, qd, d.c, false));
  SATDAR_RETURN_IF_ERROR(LinearBackward(x, dxk, g.wk, dk, xk, w.wk, n, kd, d.c, false));
  return LinearBackward(x, dxv, g.wv, dv, xv, w.wv, n, kd, d.c, false);
}
#endif

}  // namespace

template <class B>
absl::Status AttentionProjectForward(const typename B::Exec& x, AttentionActs<B>* acts,
                                     const typename B::T* xq, const typename B::T* xk,
                                     const typename B::T* xv,
                                     const AttentionWeights<typename B::T>& w,
                                     const AttentionDims& d, AttentionScratch<B>* s) {
  return ProjectQkv(x, acts->q_raw.data(), acts->k_raw.data(), acts->v.data(), s->qkv.data(),
                    xq, xk, xv, w, d);
}

namespace {

// acts->q, acts->k = RoPE(qk_norm(raw projections)) of the d.rows() rows (cos, sin: the tables
// of the rows' first position on).
template <class B>
absl::Status NormAndRotate(const typename B::Exec& x, AttentionActs<B>* acts,
                           const AttentionWeights<typename B::T>& w, const AttentionDims& d,
                           const typename B::Acc* cos, const typename B::Acc* sin) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  if (d.qk_norm) {
    SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x, acts->q.data(), acts->q_rstd.data(),
                                               acts->q_raw.data(), w.q_norm, n * d.nh, d.hs,
                                               d.eps));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x, acts->k.data(), acts->k_rstd.data(),
                                               acts->k_raw.data(), w.k_norm, n * d.nkv, d.hs,
                                               d.eps));
  } else {
    SATDAR_RETURN_IF_ERROR(
        ops::Copy(x, acts->q.data(), acts->q_raw.data(), static_cast<int64_t>(n) * qd));
    SATDAR_RETURN_IF_ERROR(
        ops::Copy(x, acts->k.data(), acts->k_raw.data(), static_cast<int64_t>(n) * kd));
  }
  SATDAR_RETURN_IF_ERROR(ops::RopeForward(x, acts->q.data(), cos, sin, d.b, d.t, d.nh, d.hs));
  return ops::RopeForward(x, acts->k.data(), cos, sin, d.b, d.t, d.nkv, d.hs);
}

}  // namespace

template <class B>
absl::Status AttentionCoreForward(const typename B::Exec& x, typename B::T* out,
                                  AttentionActs<B>* acts, const typename B::T* v,
                                  const AttentionWeights<typename B::T>& w,
                                  const AttentionDims& d, const typename B::Acc* cos,
                                  const typename B::Acc* sin) {
  const int n = d.rows(), qd = d.nh * d.hs;
  SATDAR_RETURN_IF_ERROR(NormAndRotate(x, acts, w, d, cos, sin));
  if constexpr (B::kDevice) {  // flash attention: lse instead of the probabilities
    SATDAR_RETURN_IF_ERROR(ops::AttentionForward(
        x, KernelDType<typename B::T>(), acts->att.data(), acts->lse.data(), acts->q.data(),
        acts->k.data(), v, d.b, d.t, d.nh, d.nkv, d.hs));
  } else {
    SATDAR_RETURN_IF_ERROR(ops::AttentionForward(x, acts->att.data(), acts->probs.data(),
                                                 acts->q.data(), acts->k.data(), v, d.b, d.t,
                                                 d.nh, d.nkv, d.hs));
  }
  return ops::MatmulForward(x, out, acts->att.data(), w.wo, n, d.c, qd);
}

template <class B>
absl::Status AttentionDecodeForward(const typename B::Exec& x, typename B::T* out,
                                    AttentionActs<B>* acts, const typename B::T* v,
                                    const AttentionWeights<typename B::T>& w,
                                    const AttentionDims& d, const typename B::Acc* cos,
                                    const typename B::Acc* sin, typename B::T* kcache,
                                    typename B::T* vcache, int past, int cap) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  SATDAR_CHECK(past >= 0 && past + d.t <= cap) << "positions past the KV cache";
  SATDAR_RETURN_IF_ERROR(NormAndRotate(x, acts, w, d, cos, sin));
  // The new keys and values into each sequence's rows past..past+tn-1 of the cache.
  const int64_t count = static_cast<int64_t>(d.t) * kd;
  for (int bi = 0; bi < d.b; ++bi) {
    const int64_t to = (static_cast<int64_t>(bi) * cap + past) * kd;
    SATDAR_RETURN_IF_ERROR(ops::Copy(x, kcache + to, acts->k.data() + bi * count, count));
    SATDAR_RETURN_IF_ERROR(ops::Copy(x, vcache + to, v + bi * count, count));
  }
  if constexpr (B::kDevice) {
    SATDAR_RETURN_IF_ERROR(ops::AttentionCachedForward(
        x, KernelDType<typename B::T>(), acts->att.data(), /*lse=*/nullptr, acts->q.data(),
        kcache, vcache, d.b, d.t, past, cap, d.nh, d.nkv, d.hs));
  } else {
    SATDAR_RETURN_IF_ERROR(ops::AttentionCachedForward(x, acts->att.data(), acts->q.data(),
                                                       kcache, vcache, d.b, d.t, past, cap, d.nh,
                                                       d.nkv, d.hs));
  }
  return ops::MatmulForward(x, out, acts->att.data(), w.wo, n, d.c, qd);
}

template <class B>
absl::Status AttentionCoreBackward(const typename B::Exec& x,
                                   const AttentionWeights<typename B::Acc>& g,
                                   const typename B::T* dout, const AttentionActs<B>& acts,
                                   const typename B::T* v,
                                   const AttentionWeights<typename B::T>& w,
                                   const AttentionDims& d, const typename B::Acc* cos,
                                   const typename B::Acc* sin, AttentionScratch<B>* s) {
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  const int64_t nq = static_cast<int64_t>(n) * qd, nk = static_cast<int64_t>(n) * kd;
  SATDAR_RETURN_IF_ERROR(LinearBackward(x, s->datt.data(), g.wo, dout, acts.att.data(), w.wo, n,
                                        d.c, qd, /*overwrite=*/true));
  SATDAR_RETURN_IF_ERROR(ops::Zero(x, s->dq.data(), nq));
  SATDAR_RETURN_IF_ERROR(ops::Zero(x, s->dk.data(), nk));
  SATDAR_RETURN_IF_ERROR(ops::Zero(x, s->dv.data(), nk));
  if constexpr (B::kDevice) {  // recomputes the probabilities from lse
    SATDAR_RETURN_IF_ERROR(ops::AttentionBackward(
        x, KernelDType<typename B::T>(), s->dq.data(), s->dk.data(), s->dv.data(),
        s->datt.data(), acts.att.data(), acts.lse.data(), acts.q.data(), acts.k.data(), v, d.b,
        d.t, d.nh, d.nkv, d.hs));
  } else {
    SATDAR_RETURN_IF_ERROR(ops::AttentionBackward(x, s->dq.data(), s->dk.data(), s->dv.data(),
                                                  s->datt.data(), acts.probs.data(),
                                                  acts.q.data(), acts.k.data(), v, d.b, d.t,
                                                  d.nh, d.nkv, d.hs));
  }
  SATDAR_RETURN_IF_ERROR(ops::RopeBackward(x, s->dq.data(), cos, sin, d.b, d.t, d.nh, d.hs));
  SATDAR_RETURN_IF_ERROR(ops::RopeBackward(x, s->dk.data(), cos, sin, d.b, d.t, d.nkv, d.hs));
  if (d.qk_norm) {
    SATDAR_RETURN_IF_ERROR(ops::Zero(x, s->dq_raw.data(), nq));
    SATDAR_RETURN_IF_ERROR(ops::Zero(x, s->dk_raw.data(), nk));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(x, s->dq_raw.data(), g.q_norm, s->dq.data(),
                                                acts.q_raw.data(), w.q_norm, acts.q_rstd.data(),
                                                n * d.nh, d.hs));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(x, s->dk_raw.data(), g.k_norm, s->dk.data(),
                                                acts.k_raw.data(), w.k_norm, acts.k_rstd.data(),
                                                n * d.nkv, d.hs));
  } else {
    SATDAR_RETURN_IF_ERROR(ops::Copy(x, s->dq_raw.data(), s->dq.data(), nq));
    SATDAR_RETURN_IF_ERROR(ops::Copy(x, s->dk_raw.data(), s->dk.data(), nk));
  }
  return absl::OkStatus();
}

template <class B>
absl::Status AttentionProjectBackward(const typename B::Exec& x, typename B::T* dxq,
                                      typename B::T* dxk, typename B::T* dxv,
                                      const AttentionWeights<typename B::Acc>& g,
                                      const typename B::T* dv, const typename B::T* xq,
                                      const typename B::T* xk, const typename B::T* xv,
                                      const AttentionWeights<typename B::T>& w,
                                      const AttentionDims& d, AttentionScratch<B>* s) {
  return ProjectQkvBackward(x, dxq, dxk, dxv, g, s->qkv.data(), s->dq_raw.data(),
                            s->dk_raw.data(), dv, xq, xk, xv, w, d);
}

template <class B>
absl::Status AttentionLayerForward(const typename B::Exec& x, typename B::T* out,
                                   AttentionActs<B>* acts, const typename B::T* in,
                                   const AttentionWeights<typename B::T>& w,
                                   const AttentionDims& d, const typename B::Acc* cos,
                                   const typename B::Acc* sin, AttentionScratch<B>* s) {
  SATDAR_RETURN_IF_ERROR(AttentionProjectForward(x, acts, in, in, in, w, d, s));
  return AttentionCoreForward(x, out, acts, acts->v.data(), w, d, cos, sin);
}

template <class B>
absl::Status AttentionLayerBackward(const typename B::Exec& x, typename B::T* dx,
                                    const AttentionWeights<typename B::Acc>& g,
                                    const typename B::T* dout, const AttentionActs<B>& acts,
                                    const typename B::T* in,
                                    const AttentionWeights<typename B::T>& w,
                                    const AttentionDims& d, const typename B::Acc* cos,
                                    const typename B::Acc* sin, AttentionScratch<B>* s) {
  SATDAR_RETURN_IF_ERROR(
      AttentionCoreBackward(x, g, dout, acts, acts.v.data(), w, d, cos, sin, s));
  return AttentionProjectBackward(x, dx, dx, dx, g, s->dv.data(), in, in, in, w, d, s);
}

#define SATDAR_INSTANTIATE(B)                                                                  \
  template struct AttentionActs<B>;                                                            \
  template struct AttentionScratch<B>;                                                         \
  template absl::Status AttentionProjectForward<B>(                                            \
      const B::Exec&, AttentionActs<B>*, const B::T*, const B::T*, const B::T*,                \
      const AttentionWeights<B::T>&, const AttentionDims&, AttentionScratch<B>*);              \
  template absl::Status AttentionCoreForward<B>(const B::Exec&, B::T*, AttentionActs<B>*,      \
                                                const B::T*, const AttentionWeights<B::T>&,    \
                                                const AttentionDims&, const B::Acc*,           \
                                                const B::Acc*);                                \
  template absl::Status AttentionDecodeForward<B>(                                             \
      const B::Exec&, B::T*, AttentionActs<B>*, const B::T*, const AttentionWeights<B::T>&,    \
      const AttentionDims&, const B::Acc*, const B::Acc*, B::T*, B::T*, int, int);             \
  template absl::Status AttentionCoreBackward<B>(                                              \
      const B::Exec&, const AttentionWeights<B::Acc>&, const B::T*, const AttentionActs<B>&,   \
      const B::T*, const AttentionWeights<B::T>&, const AttentionDims&, const B::Acc*,         \
      const B::Acc*, AttentionScratch<B>*);                                                    \
  template absl::Status AttentionProjectBackward<B>(                                           \
      const B::Exec&, B::T*, B::T*, B::T*, const AttentionWeights<B::Acc>&, const B::T*,       \
      const B::T*, const B::T*, const B::T*, const AttentionWeights<B::T>&,                    \
      const AttentionDims&, AttentionScratch<B>*);                                             \
  template absl::Status AttentionLayerForward<B>(                                              \
      const B::Exec&, B::T*, AttentionActs<B>*, const B::T*, const AttentionWeights<B::T>&,    \
      const AttentionDims&, const B::Acc*, const B::Acc*, AttentionScratch<B>*);               \
  template absl::Status AttentionLayerBackward<B>(                                             \
      const B::Exec&, B::T*, const AttentionWeights<B::Acc>&, const B::T*,                     \
      const AttentionActs<B>&, const B::T*, const AttentionWeights<B::T>&,                     \
      const AttentionDims&, const B::Acc*, const B::Acc*, AttentionScratch<B>*);
SATDAR_INSTANTIATE(Cpu<float>)
SATDAR_INSTANTIATE(Cpu<double>)
#if defined(SATDAR_WITH_CUDA)
SATDAR_INSTANTIATE(Cuda<float>)
SATDAR_INSTANTIATE(Cuda<__nv_bfloat16>)
#endif
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model
