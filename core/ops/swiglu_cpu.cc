#include <cmath>

#include "core/ops/swiglu.h"

namespace satdar::core::cpu {

template <typename T>
void SwigluForward(T* out, const T* gate_up, int n, int f, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* g = gate_up + r * 2 * f;
          const T* u = g + f;
          T* o = out + r * f;
          for (int j = 0; j < f; ++j) o[j] = g[j] / (T(1) + std::exp(-g[j])) * u[j];
        }
      },
      8);
}

template <typename T>
void SwigluBackward(T* dgate_up, const T* dout, const T* gate_up, int n, int f, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* g = gate_up + r * 2 * f;
          const T* u = g + f;
          const T* d = dout + r * f;
          T* dg = dgate_up + r * 2 * f;
          T* du = dg + f;
          for (int j = 0; j < f; ++j) {
            T s = T(1) / (T(1) + std::exp(-g[j]));
            du[j] = d[j] * g[j] * s;
            dg[j] = d[j] * u[j] * s * (T(1) + g[j] * (T(1) - s));
          }
        }
      },
      8);
}

template void SwigluForward<float>(float*, const float*, int, int, ThreadPool*);
template void SwigluForward<double>(double*, const double*, int, int, ThreadPool*);
template void SwigluBackward<float>(float*, const float*, const float*, int, int, ThreadPool*);
template void SwigluBackward<double>(double*, const double*, const double*, int, int,
                                     ThreadPool*);

}  // namespace satdar::core::cpu
