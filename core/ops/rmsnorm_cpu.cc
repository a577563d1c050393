#include <cmath>
#include <vector>

#include "core/ops/rmsnorm.h"

namespace satdar::core::cpu {

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int n, int c, double eps,
                    ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* x = inp + r * c;
          T* y = out + r * c;
          T ss = 0;
#pragma omp simd reduction(+ : ss)
          for (int i = 0; i < c; ++i) ss += x[i] * x[i];
          T s = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
          rstd[r] = s;
          for (int i = 0; i < c; ++i) y[i] = weight[i] * (x[i] * s);
        }
      },
      64);
}

template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int n, int c, ThreadPool* pool) {
  // Per-chunk partial dweight, summed in chunk order so the result is reproducible.
  int chunks = pool->num_threads();
  std::vector<T> partial(static_cast<size_t>(chunks) * c, T(0));
  pool->ParallelFor(
      chunks,
      [&](int64_t c0, int64_t c1) {
        for (int64_t chunk = c0; chunk < c1; ++chunk) {
          int64_t r0 = n * chunk / chunks, r1 = n * (chunk + 1) / chunks;
          T* dw = partial.data() + chunk * c;
          for (int64_t r = r0; r < r1; ++r) {
            const T* x = inp + r * c;
            const T* dy = dout + r * c;
            T* dx = dinp + r * c;
            T s = rstd[r];
            T dot = 0;  // sum_j g_j dy_j x_j
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < c; ++i) {
              dot += weight[i] * dy[i] * x[i];
              dw[i] += dy[i] * x[i] * s;
            }
            T coef = dot * s * s * s / c;
            for (int i = 0; i < c; ++i) dx[i] += weight[i] * dy[i] * s - coef * x[i];
          }
        }
      },
      1);
  if (dweight != nullptr) {
    for (int chunk = 0; chunk < chunks; ++chunk) {
      for (int i = 0; i < c; ++i) dweight[i] += partial[static_cast<size_t>(chunk) * c + i];
    }
  }
}

template void RmsNormForward<float>(float*, float*, const float*, const float*, int, int, double,
                                    ThreadPool*);
template void RmsNormForward<double>(double*, double*, const double*, const double*, int, int,
                                     double, ThreadPool*);
template void RmsNormBackward<float>(float*, float*, const float*, const float*, const float*,
                                     const float*, int, int, ThreadPool*);
template void RmsNormBackward<double>(double*, double*, const double*, const double*,
                                      const double*, const double*, int, int, ThreadPool*);

}  // namespace satdar::core::cpu
