#include <algorithm>

#include "model/variants/denseformer_ops.h"

namespace satdar::model::cpu {

template <typename T>
void DwaForward(T* out, const T* const* xs, int count, const T* a, int64_t n) {
  std::fill(out, out + n, T(0));
  for (int j = 0; j < count; ++j) {
    const T* x = xs[j];
    for (int64_t e = 0; e < n; ++e) out[e] += a[j] * x[e];
  }
}

template <typename T>
void DwaBackward(T* const* dxs, T* grad_a, const T* dy, const T* const* xs, int count,
                 const T* a, int64_t n) {
  for (int j = 0; j < count; ++j) {
    const T* x = xs[j];
    T* dx = dxs[j];
    double dot = 0;
    for (int64_t e = 0; e < n; ++e) {
      dot += static_cast<double>(x[e]) * dy[e];
      dx[e] += a[j] * dy[e];
    }
    grad_a[j] += static_cast<T>(dot);
  }
}

template void DwaForward<float>(float*, const float* const*, int, const float*, int64_t);
template void DwaForward<double>(double*, const double* const*, int, const double*, int64_t);
template void DwaBackward<float>(float* const*, float*, const float*, const float* const*, int,
                                 const float*, int64_t);
template void DwaBackward<double>(double* const*, double*, const double*, const double* const*,
                                  int, const double*, int64_t);

}  // namespace satdar::model::cpu
