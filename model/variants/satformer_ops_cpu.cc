// SATFormer's value gate on the CPU (satformer_ops.h): the reference the CUDA side is tested
// against, and what the CPU model runs.
#include "core/ops/matmul.h"
#include "core/thread_pool.h"
#include "model/variants/satformer_ops.h"

namespace satdar::model::cpu {

template <typename T>
void ValueGateForward(T* alpha, const T* x, const T* w, int n, int nkv, int c,
                      core::ThreadPool* pool) {
  core::cpu::MatmulForward(alpha, x, w, n, nkv, c, pool);
  const int64_t count = static_cast<int64_t>(n) * nkv;
  for (int64_t j = 0; j < count; ++j) alpha[j] = alpha[j] > T(0) ? alpha[j] : T(0);
}

template <typename T>
void ValueMixForward(T* vmix, const T* alpha, const T* v, const T* v1, int n, int nkv, int hs,
                     core::ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int j = 0; j < nkv; ++j) {
            const T a = alpha[r * nkv + j];
            const int64_t o = (r * nkv + j) * hs;
            for (int e = 0; e < hs; ++e) vmix[o + e] = v[o + e] + a * v1[o + e];
          }
        }
      },
      16);
}

template <typename T>
void ValueMixBackward(T* dv, T* dv1, T* dalpha, const T* dvmix, const T* v1, const T* alpha,
                      int n, int nkv, int hs, core::ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int j = 0; j < nkv; ++j) {
            const T a = alpha[r * nkv + j];
            const int64_t o = (r * nkv + j) * hs;
            T dot = 0;
            for (int e = 0; e < hs; ++e) {
              dot += v1[o + e] * dvmix[o + e];
              dv[o + e] = dvmix[o + e];
              dv1[o + e] += a * dvmix[o + e];
            }
            dalpha[r * nkv + j] = a > T(0) ? dot : T(0);  // ReLU: a closed gate passes nothing
          }
        }
      },
      16);
}

template <typename T>
void ValueGateBackward(T* dx, T* dw, const T* dalpha, const T* x, const T* w, int n, int nkv,
                       int c, core::ThreadPool* pool) {
  core::cpu::MatmulBackward(dx, dw, dalpha, x, w, n, nkv, c, pool);
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template void ValueGateForward<T>(T*, const T*, const T*, int, int, int, core::ThreadPool*); \
  template void ValueMixForward<T>(T*, const T*, const T*, const T*, int, int, int,            \
                                   core::ThreadPool*);                                         \
  template void ValueMixBackward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int,   \
                                    core::ThreadPool*);                                        \
  template void ValueGateBackward<T>(T*, T*, const T*, const T*, const T*, int, int, int,      \
                                     core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cpu
