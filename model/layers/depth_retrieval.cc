#include "model/layers/depth_retrieval.h"

#include <cmath>

namespace satdar::model {

template <typename T>
void DepthRetrievalForward(T* out, T* alpha, const std::vector<const T*>& keys,
                           const std::vector<const T*>& values, const T* w, const T* g, int n,
                           int c, double eps, core::ThreadPool* pool) {
  const int s = static_cast<int>(keys.size());
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* a = alpha + r * s;
          T mx = 0;
          for (int i = 0; i < s; ++i) {
            const T* x = keys[i] + r * c;
            T ss = 0, z = 0;
            for (int e = 0; e < c; ++e) {
              ss += x[e] * x[e];
              z += w[e] * g[e] * x[e];
            }
            a[i] = z / std::sqrt(ss / c + static_cast<T>(eps));
            mx = i == 0 || a[i] > mx ? a[i] : mx;
          }
          T sum = 0;
          for (int i = 0; i < s; ++i) sum += a[i] = std::exp(a[i] - mx);
          for (int i = 0; i < s; ++i) a[i] /= sum;
          T* o = out + r * c;
          for (int e = 0; e < c; ++e) o[e] = 0;
          for (int i = 0; i < s; ++i) {
            const T* v = values[i] + r * c;
            for (int e = 0; e < c; ++e) o[e] += a[i] * v[e];
          }
        }
      },
      16);
}

template <typename T>
void DepthRetrievalBackward(const std::vector<T*>& dkeys, const std::vector<T*>& dvalues, T* dw,
                            T* dg, const T* dout, const T* alpha,
                            const std::vector<const T*>& keys, const std::vector<const T*>& values,
                            const T* w, const T* g, int n, int c, double eps,
                            core::ThreadPool* pool) {
  const int s = static_cast<int>(keys.size());
  const int chunks = pool->num_threads();
  std::vector<T> partial(static_cast<size_t>(chunks) * 2 * c, T(0));  // [dw | dg] per chunk
  pool->ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
    std::vector<T> da(s), dz(s), dxhat(c);
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      T* pw = partial.data() + chunk * 2 * c;
      T* pg = pw + c;
      const int64_t row0 = n * chunk / chunks, row1 = n * (chunk + 1) / chunks;
      for (int64_t r = row0; r < row1; ++r) {
        const T* a = alpha + r * s;
        const T* d = dout + r * c;
        T dot = 0;
        for (int i = 0; i < s; ++i) {
          const T* v = values[i] + r * c;
          T acc = 0;
          for (int e = 0; e < c; ++e) acc += v[e] * d[e];
          da[i] = acc;
          dot += a[i] * acc;
        }
        for (int i = 0; i < s; ++i) dz[i] = a[i] * (da[i] - dot);
        for (int i = 0; i < s; ++i) {
          if (dvalues[i] != nullptr) {
            T* dv = dvalues[i] + r * c;
            for (int e = 0; e < c; ++e) dv[e] += a[i] * d[e];
          }
          const T* x = keys[i] + r * c;
          T ss = 0;
          for (int e = 0; e < c; ++e) ss += x[e] * x[e];
          const T rs = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
          // z = sum_e w_e g_e xhat_e, xhat = x * rs.
          T proj = 0;  // sum_e dxhat_e x_e
          for (int e = 0; e < c; ++e) {
            const T xh = x[e] * rs;
            pw[e] += dz[i] * g[e] * xh;
            pg[e] += dz[i] * w[e] * xh;
            dxhat[e] = dz[i] * w[e] * g[e];
            proj += dxhat[e] * x[e];
          }
          if (dkeys[i] != nullptr) {
            T* dk = dkeys[i] + r * c;
            const T coef = proj * rs * rs * rs / c;
            for (int e = 0; e < c; ++e) dk[e] += rs * dxhat[e] - coef * x[e];
          }
        }
      }
    }
  });
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const T* pw = partial.data() + static_cast<size_t>(chunk) * 2 * c;
    for (int e = 0; e < c; ++e) {
      dw[e] += pw[e];
      dg[e] += pw[c + e];
    }
  }
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template void DepthRetrievalForward<T>(T*, T*, const std::vector<const T*>&,                 \
                                         const std::vector<const T*>&, const T*, const T*, int, \
                                         int, double, core::ThreadPool*);                      \
  template void DepthRetrievalBackward<T>(                                                     \
      const std::vector<T*>&, const std::vector<T*>&, T*, T*, const T*, const T*,              \
      const std::vector<const T*>&, const std::vector<const T*>&, const T*, const T*, int, int, \
      double, core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model
