// AttnRes's and DAR's depth retrieval on the CPU (depth_retrieval_ops.h): the reference the
// CUDA side is tested against, and what the CPU models run (DAR's hot path). The loops are
// those of the former model/layers/depth_retrieval.cc with the std::vector source lists
// replaced by pointer arrays: per element the same operations in the same order, so the models'
// results did not change bit for bit when they moved here. Rows run in parallel (at least 16 a
// worker); the backward accumulates d/dw and d/dg per chunk of rows (one per thread) and adds
// the chunks in chunk order.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/variants/depth_retrieval_ops.h"

namespace satdar::model::cpu {

template <typename T>
void DepthRetrievalForward(T* out, T* alpha, const T* const* keys, const T* const* values,
                           int sources, const T* w, const T* g, int n, int c, double eps,
                           core::ThreadPool* pool) {
  const int s = sources;
  std::vector<T> wg(c);
  for (int e = 0; e < c; ++e) wg[e] = w[e] * g[e];
  const T* __restrict wgp = wg.data();
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* a = alpha + r * s;
          T mx = 0;
          for (int i = 0; i < s; ++i) {
            const T* __restrict x = keys[i] + r * c;
            T ss = 0, z = 0;
#pragma omp simd reduction(+ : ss, z)
            for (int e = 0; e < c; ++e) {
              ss += x[e] * x[e];
              z += wgp[e] * x[e];
            }
            a[i] = z / std::sqrt(ss / c + static_cast<T>(eps));
            mx = i == 0 || a[i] > mx ? a[i] : mx;
          }
          T sum = 0;
          for (int i = 0; i < s; ++i) sum += a[i] = std::exp(a[i] - mx);
          for (int i = 0; i < s; ++i) a[i] /= sum;
          T* __restrict o = out + r * c;
          for (int e = 0; e < c; ++e) o[e] = 0;
          for (int i = 0; i < s; ++i) {
            const T* __restrict v = values[i] + r * c;
            const T ai = a[i];
#pragma omp simd
            for (int e = 0; e < c; ++e) o[e] += ai * v[e];
          }
        }
      },
      16);
}

template <typename T>
void DepthRetrievalBackward(T* const* dkeys, T* const* dvalues, T* dw, T* dg, const T* dout,
                            const T* alpha, const T* const* keys, const T* const* values,
                            int sources, const T* w, const T* g, int n, int c, double eps,
                            core::ThreadPool* pool) {
  const int s = sources;
  const int chunks = pool->num_threads();
  // Per chunk: sum over rows and sources of (d/dz * rstd) x; dw = g * sum, dg = w * sum.
  std::vector<T> partial(static_cast<size_t>(chunks) * c, T(0));
  std::vector<T> wg(c);
  for (int e = 0; e < c; ++e) wg[e] = w[e] * g[e];
  const T* __restrict wgp = wg.data();
  // AttnRes reads keys and values from the same sources: one pass per source then does the
  // three sums, and a second writes the source's whole gradient.
  bool same = true;
  for (int i = 0; i < s; ++i) same = same && keys[i] == values[i] && dkeys[i] == dvalues[i];
  pool->ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
    std::vector<T> dz(s), qs(s), rss(s);
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      T* __restrict acc = partial.data() + chunk * c;
      const int64_t row0 = n * chunk / chunks, row1 = n * (chunk + 1) / chunks;
      for (int64_t r = row0; r < row1; ++r) {
        const T* a = alpha + r * s;
        const T* __restrict d = dout + r * c;
        T dot = 0;
        for (int i = 0; i < s; ++i) {
          const T* __restrict v = values[i] + r * c;
          T da = 0;
#pragma omp simd reduction(+ : da)
          for (int e = 0; e < c; ++e) da += v[e] * d[e];
          if (same) {
            T ss = 0, q = 0;
#pragma omp simd reduction(+ : ss, q)
            for (int e = 0; e < c; ++e) {
              ss += v[e] * v[e];
              q += wgp[e] * v[e];
            }
            qs[i] = q;
            rss[i] = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
          }
          dz[i] = da;
          dot += a[i] * da;
        }
        for (int i = 0; i < s; ++i) {
          dz[i] = a[i] * (dz[i] - dot);
          const T* __restrict x = keys[i] + r * c;
          const T ai = a[i];
          if (same) {
            const T rs = rss[i], ar = dz[i] * rs;
            const T coef = dz[i] * qs[i] * rs * rs * rs / c;
            if (dkeys[i] != nullptr) {
              T* __restrict g = dkeys[i] + r * c;
#pragma omp simd
              for (int e = 0; e < c; ++e) {
                g[e] += ai * d[e] + ar * wgp[e] - coef * x[e];
                acc[e] += ar * x[e];
              }
            } else {
#pragma omp simd
              for (int e = 0; e < c; ++e) acc[e] += ar * x[e];
            }
            continue;
          }
          if (dvalues[i] != nullptr) {
            T* __restrict dv = dvalues[i] + r * c;
#pragma omp simd
            for (int e = 0; e < c; ++e) dv[e] += ai * d[e];
          }
          T ss = 0, q = 0;
#pragma omp simd reduction(+ : ss, q)
          for (int e = 0; e < c; ++e) {
            ss += x[e] * x[e];
            q += wgp[e] * x[e];
          }
          const T rs = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
          const T ar = dz[i] * rs;
#pragma omp simd
          for (int e = 0; e < c; ++e) acc[e] += ar * x[e];
          if (dkeys[i] != nullptr) {
            // d/dx of rstd * (wg . x): rstd * wg - rstd^3 (wg . x) x / C, times dz.
            T* __restrict dk = dkeys[i] + r * c;
            const T coef = dz[i] * q * rs * rs * rs / c;
#pragma omp simd
            for (int e = 0; e < c; ++e) dk[e] += ar * wgp[e] - coef * x[e];
          }
        }
      }
    }
  });
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const T* p = partial.data() + static_cast<size_t>(chunk) * c;
    for (int e = 0; e < c; ++e) {
      dw[e] += g[e] * p[e];
      dg[e] += w[e] * p[e];
    }
  }
}

template <typename T>
void DualDepthRetrievalForward(T* const out[2], T* const alpha[2], const DualRetrieval<T>& r,
                               int n, int c, double eps, core::ThreadPool* pool) {
  const int s = r.sources;
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        std::vector<T> wg(2 * c), z(2 * s);
        for (int e = 0; e < c; ++e) {
          wg[e] = r.w[0][e] * r.g[e];
          wg[c + e] = r.w[1][e] * r.g[e];
        }
        const T* __restrict wg0 = wg.data();
        const T* __restrict wg1 = wg.data() + c;
        for (int64_t row = r0; row < r1; ++row) {
          // One pass over every source row of both streams: norms and both targets' logits.
          for (int i = 0; i < s; ++i) {
            for (int t = 0; t < 2; ++t) {
              if (r.key[0] != t && r.key[1] != t) continue;
              const T* __restrict x = r.streams[t][i] + row * c;
              T ss = 0, z0 = 0, z1 = 0;
#pragma omp simd reduction(+ : ss, z0, z1)
              for (int e = 0; e < c; ++e) {
                ss += x[e] * x[e];
                z0 += wg0[e] * x[e];
                z1 += wg1[e] * x[e];
              }
              const T rs = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
              if (r.key[0] == t) z[i] = z0 * rs;
              if (r.key[1] == t) z[s + i] = z1 * rs;
            }
          }
          for (int t = 0; t < 2; ++t) {
            T* a = alpha[t] + row * s;
            T mx = z[t * s];
            for (int i = 1; i < s; ++i) mx = z[t * s + i] > mx ? z[t * s + i] : mx;
            T sum = 0;
            for (int i = 0; i < s; ++i) sum += a[i] = std::exp(z[t * s + i] - mx);
            for (int i = 0; i < s; ++i) a[i] /= sum;
            T* __restrict o = out[t] + row * c;
            for (int e = 0; e < c; ++e) o[e] = 0;
            for (int i = 0; i < s; ++i) {
              const T* __restrict v = r.streams[r.value[t]][i] + row * c;
              const T ai = a[i];
#pragma omp simd
              for (int e = 0; e < c; ++e) o[e] += ai * v[e];
            }
          }
        }
      },
      16);
}

template <typename T>
void DualDepthRetrievalBackward(T* const* const dstreams[2], T* const dw[2], T* dg,
                                const T* const dout[2], const T* const alpha[2],
                                const DualRetrieval<T>& r, int n, int c, double eps,
                                core::ThreadPool* pool) {
  const int s = r.sources;
  const int chunks = pool->num_threads();
  // Per chunk: sums over rows and sources of (d/dz_0 * rstd) x and (d/dz_1 * rstd) x, which
  // give dw_s = g * sum_s and dg = w_0 * sum_0 + w_1 * sum_1 at the end.
  std::vector<T> partial(static_cast<size_t>(chunks) * 2 * c, T(0));
  std::vector<T> wg(2 * c);
  for (int e = 0; e < c; ++e) {
    wg[e] = r.w[0][e] * r.g[e];
    wg[c + e] = r.w[1][e] * r.g[e];
  }
  const T* __restrict wg0 = wg.data();
  const T* __restrict wg1 = wg.data() + c;
  pool->ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
    std::vector<T> dz(2 * s);
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      T* __restrict acc0 = partial.data() + chunk * 2 * c;
      T* __restrict acc1 = acc0 + c;
      const int64_t row0 = n * chunk / chunks, row1 = n * (chunk + 1) / chunks;
      for (int64_t row = row0; row < row1; ++row) {
        // Softmax backward for both targets, and the values' gradients.
        for (int t = 0; t < 2; ++t) {
          const T* a = alpha[t] + row * s;
          const T* __restrict d = dout[t] + row * c;
          T dot = 0;
          for (int i = 0; i < s; ++i) {
            const T* __restrict v = r.streams[r.value[t]][i] + row * c;
            T acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int e = 0; e < c; ++e) acc += v[e] * d[e];
            dz[t * s + i] = acc;
            dot += a[i] * acc;
          }
          for (int i = 0; i < s; ++i) {
            dz[t * s + i] = a[i] * (dz[t * s + i] - dot);
            T* dv = dstreams[r.value[t]][i];
            if (dv == nullptr) continue;
            T* __restrict dvr = dv + row * c;
            const T ai = a[i];
#pragma omp simd
            for (int e = 0; e < c; ++e) dvr[e] += ai * d[e];
          }
        }
        // The keys: z_t,i = rstd * sum_e w_t,e g_e x_e over source i of the key stream.
        for (int i = 0; i < s; ++i) {
          for (int k = 0; k < 2; ++k) {
            const bool used0 = r.key[0] == k, used1 = r.key[1] == k;
            if (!used0 && !used1) continue;
            const T* __restrict x = r.streams[k][i] + row * c;
            T ss = 0, q0 = 0, q1 = 0;
#pragma omp simd reduction(+ : ss, q0, q1)
            for (int e = 0; e < c; ++e) {
              ss += x[e] * x[e];
              q0 += wg0[e] * x[e];
              q1 += wg1[e] * x[e];
            }
            const T rs = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
            const T d0 = used0 ? dz[i] : T(0), d1 = used1 ? dz[s + i] : T(0);
            const T a0 = d0 * rs, a1 = d1 * rs;
#pragma omp simd
            for (int e = 0; e < c; ++e) {
              acc0[e] += a0 * x[e];
              acc1[e] += a1 * x[e];
            }
            T* dk = dstreams[k][i];
            if (dk == nullptr) continue;
            // d/dx of rstd * (q . x): rstd * q - rstd^3 (q . x) x / C, with q = d0 wg0 + d1 wg1.
            T* __restrict dkr = dk + row * c;
            const T coef = (d0 * q0 + d1 * q1) * rs * rs * rs / c;
#pragma omp simd
            for (int e = 0; e < c; ++e) dkr[e] += rs * (d0 * wg0[e] + d1 * wg1[e]) - coef * x[e];
          }
        }
      }
    }
  });
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const T* p = partial.data() + static_cast<size_t>(chunk) * 2 * c;
    for (int e = 0; e < c; ++e) {
      dw[0][e] += r.g[e] * p[e];
      dw[1][e] += r.g[e] * p[c + e];
      dg[e] += r.w[0][e] * p[e] + r.w[1][e] * p[c + e];
    }
  }
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template void DepthRetrievalForward<T>(T*, T*, const T* const*, const T* const*, int,            \
                                         const T*, const T*, int, int, double,                     \
                                         core::ThreadPool*);                                       \
  template void DepthRetrievalBackward<T>(T* const*, T* const*, T*, T*, const T*, const T*,        \
                                          const T* const*, const T* const*, int, const T*,         \
                                          const T*, int, int, double, core::ThreadPool*);          \
  template void DualDepthRetrievalForward<T>(T* const[2], T* const[2], const DualRetrieval<T>&,    \
                                             int, int, double, core::ThreadPool*);                 \
  template void DualDepthRetrievalBackward<T>(T* const* const[2], T* const[2], T*,                 \
                                              const T* const[2], const T* const[2],                \
                                              const DualRetrieval<T>&, int, int, double,           \
                                              core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cpu
