#include <cmath>

#include "core/ops/swiglu.h"

namespace satdar::core::cpu {

template <typename T>
void SwigluForward(T* out, const T* gate, const T* up, int64_t n, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          T g = gate[i];
          out[i] = g / (T(1) + std::exp(-g)) * up[i];
        }
      },
      4096);
}

template <typename T>
void SwigluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n,
                    ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          T g = gate[i];
          T s = T(1) / (T(1) + std::exp(-g));
          T silu = g * s;
          dup[i] = dout[i] * silu;
          dgate[i] = dout[i] * up[i] * s * (T(1) + g * (T(1) - s));
        }
      },
      4096);
}

template void SwigluForward<float>(float*, const float*, const float*, int64_t, ThreadPool*);
template void SwigluForward<double>(double*, const double*, const double*, int64_t, ThreadPool*);
template void SwigluBackward<float>(float*, float*, const float*, const float*, const float*,
                                    int64_t, ThreadPool*);
template void SwigluBackward<double>(double*, double*, const double*, const double*,
                                     const double*, int64_t, ThreadPool*);

}  // namespace satdar::core::cpu
