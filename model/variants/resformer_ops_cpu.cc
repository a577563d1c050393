#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "model/variants/resformer_ops.h"

namespace satdar::model::cpu {

namespace {

template <typename T>
std::vector<double> Softmax(const ResformerLambdas<T>& p) {
  std::vector<double> out(p.layers - 1);
  double mx = p.logits[0];
  for (int k = 1; k < p.layers - 1; ++k) mx = std::max<double>(mx, p.logits[k]);
  double sum = 0;
  for (int k = 0; k < p.layers - 1; ++k) sum += out[k] = std::exp(p.logits[k] - mx);
  for (double& x : out) x /= sum;
  return out;
}

}  // namespace

template <typename T>
void ResformerMix(const ResformerLambdas<T>& p, double* l1, double* l2) {
  if (p.scale == nullptr) {
    *l1 = *l2 = 0.5;
    return;
  }
  *l1 = static_cast<double>(static_cast<T>(p.scale[0] * Softmax(p)[p.layer - 1]));
  *l2 = p.lambda2[0];
}

template <typename T>
void ResformerMixForward(T* vmix, const T* v1, const T* v, const ResformerLambdas<T>& p,
                         int64_t n, core::ThreadPool* pool) {
  double a, b;
  ResformerMix(p, &a, &b);
  const T l1 = static_cast<T>(a), l2 = static_cast<T>(b);
  pool->ParallelFor(
      n,
      [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e) vmix[e] = l1 * v1[e] + l2 * v[e];
      },
      4096);
}

template <typename T>
void ResformerMixBackward(T* dv, T* dv1, const T* dvmix, const T* v1, const T* v,
                          const ResformerLambdas<T>& p, T* grad_scale, T* grad_logits,
                          T* grad_lambda2, int64_t n) {
  double a, b;
  ResformerMix(p, &a, &b);
  const T l1 = static_cast<T>(a), l2 = static_cast<T>(b);
  double dl1 = 0, dl2 = 0;
  for (int64_t e = 0; e < n; ++e) {
    dl1 += static_cast<double>(v1[e]) * dvmix[e];
    dl2 += static_cast<double>(v[e]) * dvmix[e];
    dv[e] = l2 * dvmix[e];
    dv1[e] += l1 * dvmix[e];
  }
  if (p.scale == nullptr) return;
  grad_lambda2[0] += static_cast<T>(dl2);
  // l1 = s q_j, q = softmax(logits), j = layer - 1: ds += dl1 q_j; dlogit_k += s dl1 q_j (delta_jk - q_k).
  const std::vector<double> q = Softmax(p);
  const double s = p.scale[0];
  const int j = p.layer - 1;
  grad_scale[0] += static_cast<T>(dl1 * q[j]);
  for (int k = 0; k < p.layers - 1; ++k) {
    grad_logits[k] += static_cast<T>(s * dl1 * q[j] * ((k == j ? 1.0 : 0.0) - q[k]));
  }
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template void ResformerMix<T>(const ResformerLambdas<T>&, double*, double*);                \
  template void ResformerMixForward<T>(T*, const T*, const T*, const ResformerLambdas<T>&,     \
                                       int64_t, core::ThreadPool*);                            \
  template void ResformerMixBackward<T>(T*, T*, const T*, const T*, const T*,                  \
                                        const ResformerLambdas<T>&, T*, T*, T*, int64_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cpu
