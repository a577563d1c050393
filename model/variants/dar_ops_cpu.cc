#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "model/variants/dar_ops.h"

namespace satdar::model::cpu {

namespace {

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

template <typename F>
void Elementwise(core::ThreadPool* pool, int64_t n, const F& f) {
  pool->ParallelFor(
      n,
      [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e) f(e);
      },
      4096);
}

}  // namespace

template <typename T>
void DarMixCoefficients(const T* a, double* c0, double* c1) {
  const double m = std::max<double>(a[0], a[1]);
  const double e0 = std::exp(a[0] - m), e1 = std::exp(a[1] - m);
  *c0 = e0 / (e0 + e1);
  *c1 = e1 / (e0 + e1);
}

template <typename T>
void DarWriteCoefficients(const T* transport, const T* write, double* rho, double* b0,
                          double* b1) {
  *rho = Sigmoid(transport[0]);
  *b0 = 2 * Sigmoid(write[0]);
  *b1 = 2 * Sigmoid(write[1]);
}

template <typename T>
void DarMixForward(T* u, const T* r0, const T* r1, const T* mix, int64_t n,
                   core::ThreadPool* pool) {
  double c0, c1;
  DarMixCoefficients(mix, &c0, &c1);
  Elementwise(pool, n, [&](int64_t e) {
    u[e] = static_cast<T>(c0) * r0[e] + static_cast<T>(c1) * r1[e];
  });
}

template <typename T>
void DarMixBackward(T* dr0, T* dr1, const T* du, const T* r0, const T* r1, const T* mix,
                    T* grad_mix, int64_t n, core::ThreadPool* pool) {
  double c[2];
  DarMixCoefficients(mix, &c[0], &c[1]);
  const T c0 = static_cast<T>(c[0]), c1 = static_cast<T>(c[1]);
  const auto dc = core::ParallelSum<2>(pool, n, [&](int64_t e0, int64_t e1, double* acc) {
    double a0 = 0, a1 = 0;
#pragma omp simd reduction(+ : a0, a1)
    for (int64_t e = e0; e < e1; ++e) {
      a0 += static_cast<double>(r0[e] * du[e]);
      a1 += static_cast<double>(r1[e] * du[e]);
      dr0[e] = c0 * du[e];
      dr1[e] = c1 * du[e];
    }
    acc[0] += a0;
    acc[1] += a1;
  });
  const double dot = c[0] * dc[0] + c[1] * dc[1];
  for (int s = 0; s < 2; ++s) grad_mix[s] += static_cast<T>(c[s] * (dc[s] - dot));
}

template <typename T>
void DarWriteForward(T* q0, T* q1, const T* p0, const T* p1, const T* y, const T* transport,
                     const T* write, int64_t n, core::ThreadPool* pool) {
  const T rho = static_cast<T>(Sigmoid(transport[0]));
  const T b0 = static_cast<T>(2 * Sigmoid(write[0]));
  const T b1 = static_cast<T>(2 * Sigmoid(write[1]));
  const bool has_p = p0 != nullptr;
  Elementwise(pool, n, [&](int64_t e) {
    const T a = has_p ? p0[e] : T(0), b = has_p ? p1[e] : T(0);
    q0[e] = rho * a + (T(1) - rho) * b + b0 * y[e];
    q1[e] = (T(1) - rho) * a + rho * b + b1 * y[e];
  });
}

template <typename T>
void DarWriteBackward(T* dy, T* dp0, T* dp1, const T* g0s, const T* g1s, const T* y,
                      const T* p0, const T* p1, const T* transport, const T* write,
                      T* grad_transport, T* grad_write, int64_t n, core::ThreadPool* pool) {
  const double rho = Sigmoid(transport[0]);
  const double sw0 = Sigmoid(write[0]), sw1 = Sigmoid(write[1]);
  const T b0 = static_cast<T>(2 * sw0), b1 = static_cast<T>(2 * sw1);
  const T tr = static_cast<T>(rho);
  const bool has_p = p0 != nullptr;
  const auto sums = core::ParallelSum<3>(pool, n, [&](int64_t e0, int64_t e1, double* acc) {
    double a0 = 0, a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a0, a1, a2)
    for (int64_t e = e0; e < e1; ++e) {
      const T g0 = g0s[e], g1 = g1s[e];
      dy[e] = b0 * g0 + b1 * g1;
      a0 += static_cast<double>(y[e] * g0);
      a1 += static_cast<double>(y[e] * g1);
      const T pd = has_p ? p0[e] - p1[e] : T(0);
      a2 += static_cast<double>(pd * (g0 - g1));
      dp0[e] = has_p ? tr * g0 + (T(1) - tr) * g1 : T(0);
      dp1[e] = has_p ? (T(1) - tr) * g0 + tr * g1 : T(0);
    }
    acc[0] += a0;
    acc[1] += a1;
    acc[2] += a2;
  });
  grad_write[0] += static_cast<T>(sums[0] * 2 * sw0 * (1 - sw0));
  grad_write[1] += static_cast<T>(sums[1] * 2 * sw1 * (1 - sw1));
  grad_transport[0] += static_cast<T>(sums[2] * rho * (1 - rho));
}

#define SATDAR_INSTANTIATE(T)                                                                   \
  template void DarMixCoefficients<T>(const T*, double*, double*);                              \
  template void DarWriteCoefficients<T>(const T*, const T*, double*, double*, double*);         \
  template void DarMixForward<T>(T*, const T*, const T*, const T*, int64_t, core::ThreadPool*); \
  template void DarMixBackward<T>(T*, T*, const T*, const T*, const T*, const T*, T*, int64_t,  \
                                  core::ThreadPool*);                                           \
  template void DarWriteForward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,    \
                                   int64_t, core::ThreadPool*);                                 \
  template void DarWriteBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,         \
                                    const T*, const T*, const T*, T*, T*, int64_t,              \
                                    core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cpu
