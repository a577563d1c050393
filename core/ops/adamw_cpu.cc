#include <cmath>

#include "core/ops/adamw.h"

namespace satdar::core::cpu {

template <typename T>
void AdamWUpdate(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p,
                 ThreadPool* pool) {
  const T b1 = static_cast<T>(p.beta1), b2 = static_cast<T>(p.beta2);
  const T c1 = static_cast<T>(1.0 - std::pow(p.beta1, static_cast<double>(p.step)));
  const T c2 = static_cast<T>(1.0 - std::pow(p.beta2, static_cast<double>(p.step)));
  const T lr = static_cast<T>(p.lr), eps = static_cast<T>(p.eps);
  const T wd = static_cast<T>(p.weight_decay), gs = static_cast<T>(p.grad_scale);
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          T g = grad[i] * gs;
          m[i] = b1 * m[i] + (T(1) - b1) * g;
          v[i] = b2 * v[i] + (T(1) - b2) * g * g;
          T mhat = m[i] / c1, vhat = v[i] / c2;
          param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
        }
      },
      4096);
}

template void AdamWUpdate<float>(float*, const float*, float*, float*, int64_t,
                                 const AdamWParams&, ThreadPool*);
template void AdamWUpdate<double>(double*, const double*, double*, double*, int64_t,
                                  const AdamWParams&, ThreadPool*);

}  // namespace satdar::core::cpu
