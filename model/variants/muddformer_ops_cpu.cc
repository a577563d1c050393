// MUDDFormer's dense connection on the CPU (muddformer_ops.h): the reference the CUDA side is
// tested against, and what the CPU model runs. The loops are MuddFormer::DenseConnection's and
// DenseConnectionBackward's as they were inline: per element the same operations in the same
// order, so the model's results did not change bit for bit when they moved here. Rows are
// independent and run in parallel; the one sum across rows (the static weights' gradient) runs
// serially in row order after them.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/thread_pool.h"
#include "model/variants/muddformer_ops.h"

namespace satdar::model::cpu {

namespace {

constexpr int64_t kElementChunk = 4096;  // the least elements a GELU worker takes
constexpr int64_t kRowChunk = 16;        // the least rows a combine worker takes

template <typename T>
T Gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x / std::sqrt(T(2))));
}

template <typename T>
T GeluGrad(T x) {
  return T(0.5) * (T(1) + std::erf(x / std::sqrt(T(2)))) +
         x * std::exp(-x * x / 2) / std::sqrt(T(2) * T(M_PI));
}

}  // namespace

template <typename T>
void GeluForward(T* g, const T* h, int64_t n, core::ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e) g[e] = Gelu(h[e]);
      },
      kElementChunk);
}

template <typename T>
void GeluBackward(T* dh, const T* dg, const T* h, int64_t n, core::ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e) dh[e] = dg[e] * GeluGrad(h[e]);  // dh may be dg
      },
      kElementChunk);
}

template <typename T>
void DenseCombineForward(T* const* outs, int ways, const T* const* xs, int sources, const T* a,
                         int ld, const T* stat, int rows, int c, core::ThreadPool* pool) {
  SATDAR_CHECK(ld >= ways * sources) << "ld " << ld << " < " << ways << " x " << sources;
  const int s = sources;
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* ar = a + r * ld;
          for (int w = 0; w < ways; ++w) {
            T* out = outs[w] + r * c;
            std::fill(out, out + c, T(0));
            for (int j = 0; j < s; ++j) {
              const T coef = ar[w * s + j] + stat[w * s + j];
              const T* xj = xs[j] + r * c;
              for (int e = 0; e < c; ++e) out[e] += coef * xj[e];
            }
          }
        }
      },
      kRowChunk);
}

template <typename T>
void DenseCombineBackward(T* da, T* grad_stat, T* const* dxs, const T* const* douts, int ways,
                          const T* const* xs, int sources, const T* a, int ld, const T* stat,
                          int rows, int c, core::ThreadPool* pool) {
  SATDAR_CHECK(ld >= ways * sources) << "ld " << ld << " < " << ways << " x " << sources;
  const int s = sources, cols = ways * sources;
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* ar = a + r * ld;
          T* dar = da + r * ld;
          for (int w = 0; w < ways; ++w) {
            const T* g = douts[w] + r * c;
            for (int j = 0; j < s; ++j) {
              const T coef = ar[w * s + j] + stat[w * s + j];
              const T* xj = xs[j] + r * c;
              T* dxj = dxs[j] + r * c;
              T dot = 0;
              for (int e = 0; e < c; ++e) {
                dot += xj[e] * g[e];
                dxj[e] += coef * g[e];
              }
              dar[w * s + j] = dot;
            }
          }
          std::fill(dar + cols, dar + ld, T(0));
        }
      },
      kRowChunk);
  for (int64_t r = 0; r < rows; ++r) {
    for (int q = 0; q < cols; ++q) grad_stat[q] += da[r * ld + q];
  }
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template void GeluForward<T>(T*, const T*, int64_t, core::ThreadPool*);                      \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t, core::ThreadPool*);           \
  template void DenseCombineForward<T>(T* const*, int, const T* const*, int, const T*, int,    \
                                       const T*, int, int, core::ThreadPool*);                 \
  template void DenseCombineBackward<T>(T*, T*, T* const*, const T* const*, int,               \
                                        const T* const*, int, const T*, int, const T*, int, int, \
                                        core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cpu
