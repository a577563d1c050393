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

template <typename T>
void DualDepthRetrievalForward(T* const out[2], T* const alpha[2], const DualRetrieval<T>& r,
                               int n, int c, double eps, core::ThreadPool* pool) {
  const int s = static_cast<int>(r.streams[0]->size());
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        std::vector<T> rstd(2 * s), wg(2 * c);
        for (int e = 0; e < c; ++e) {
          wg[e] = r.w[0][e] * r.g[e];
          wg[c + e] = r.w[1][e] * r.g[e];
        }
        for (int64_t row = r0; row < r1; ++row) {
          // One pass over every source row of both streams: norms and both streams' logits.
          std::vector<T> z(2 * s, T(0));
          for (int i = 0; i < s; ++i) {
            for (int t = 0; t < 2; ++t) {
              const T* x = (*r.streams[t])[i] + row * c;
              T ss = 0, z0 = 0, z1 = 0;
              for (int e = 0; e < c; ++e) {
                ss += x[e] * x[e];
                z0 += wg[e] * x[e];
                z1 += wg[c + e] * x[e];
              }
              rstd[t * s + i] = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
              if (r.key[0] == t) z[i] = z0 * rstd[t * s + i];
              if (r.key[1] == t) z[s + i] = z1 * rstd[t * s + i];
            }
          }
          for (int t = 0; t < 2; ++t) {
            T* a = alpha[t] + row * s;
            T mx = z[t * s];
            for (int i = 1; i < s; ++i) mx = z[t * s + i] > mx ? z[t * s + i] : mx;
            T sum = 0;
            for (int i = 0; i < s; ++i) sum += a[i] = std::exp(z[t * s + i] - mx);
            for (int i = 0; i < s; ++i) a[i] /= sum;
            T* o = out[t] + row * c;
            for (int e = 0; e < c; ++e) o[e] = 0;
            for (int i = 0; i < s; ++i) {
              const T* v = (*r.streams[r.value[t]])[i] + row * c;
              for (int e = 0; e < c; ++e) o[e] += a[i] * v[e];
            }
          }
        }
      },
      16);
}

template <typename T>
void DualDepthRetrievalBackward(const std::vector<T*>* const dstreams[2], T* const dw[2], T* dg,
                                const T* const dout[2], const T* const alpha[2],
                                const DualRetrieval<T>& r, int n, int c, double eps,
                                core::ThreadPool* pool) {
  const int s = static_cast<int>(r.streams[0]->size());
  const int chunks = pool->num_threads();
  // Per chunk: [dw0 | dw1 | dg].
  std::vector<T> partial(static_cast<size_t>(chunks) * 3 * c, T(0));
  pool->ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
    std::vector<T> dz(2 * s), dxhat(c);
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      T* pw[2] = {partial.data() + chunk * 3 * c, partial.data() + chunk * 3 * c + c};
      T* pg = partial.data() + chunk * 3 * c + 2 * c;
      const int64_t row0 = n * chunk / chunks, row1 = n * (chunk + 1) / chunks;
      for (int64_t row = row0; row < row1; ++row) {
        // Softmax backward for both targets; the values' gradients.
        for (int t = 0; t < 2; ++t) {
          const T* a = alpha[t] + row * s;
          const T* d = dout[t] + row * c;
          T dot = 0;
          for (int i = 0; i < s; ++i) {
            const T* v = (*r.streams[r.value[t]])[i] + row * c;
            T acc = 0;
            for (int e = 0; e < c; ++e) acc += v[e] * d[e];
            dz[t * s + i] = acc;
            dot += a[i] * acc;
          }
          for (int i = 0; i < s; ++i) dz[t * s + i] = a[i] * (dz[t * s + i] - dot);
          for (int i = 0; i < s; ++i) {
            T* dv = (*dstreams[r.value[t]])[i];
            if (dv == nullptr) continue;
            dv += row * c;
            for (int e = 0; e < c; ++e) dv[e] += a[i] * d[e];
          }
        }
        // The keys: z_t,i = sum_e w_t,e g_e xhat_e over the key stream's source i.
        for (int i = 0; i < s; ++i) {
          for (int k = 0; k < 2; ++k) {  // key stream k
            const bool used0 = r.key[0] == k, used1 = r.key[1] == k;
            if (!used0 && !used1) continue;
            const T* x = (*r.streams[k])[i] + row * c;
            T ss = 0;
            for (int e = 0; e < c; ++e) ss += x[e] * x[e];
            const T rs = T(1) / std::sqrt(ss / c + static_cast<T>(eps));
            const T d0 = used0 ? dz[i] : T(0), d1 = used1 ? dz[s + i] : T(0);
            T proj = 0;
            for (int e = 0; e < c; ++e) {
              const T xh = x[e] * rs;
              pw[0][e] += d0 * r.g[e] * xh;
              pw[1][e] += d1 * r.g[e] * xh;
              pg[e] += (d0 * r.w[0][e] + d1 * r.w[1][e]) * xh;
              dxhat[e] = (d0 * r.w[0][e] + d1 * r.w[1][e]) * r.g[e];
              proj += dxhat[e] * x[e];
            }
            T* dk = (*dstreams[k])[i];
            if (dk == nullptr) continue;
            dk += row * c;
            const T coef = proj * rs * rs * rs / c;
            for (int e = 0; e < c; ++e) dk[e] += rs * dxhat[e] - coef * x[e];
          }
        }
      }
    }
  });
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const T* p = partial.data() + static_cast<size_t>(chunk) * 3 * c;
    for (int e = 0; e < c; ++e) {
      dw[0][e] += p[e];
      dw[1][e] += p[c + e];
      dg[e] += p[2 * c + e];
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
      double, core::ThreadPool*);                                                              \
  template void DualDepthRetrievalForward<T>(T* const[2], T* const[2], const DualRetrieval<T>&, \
                                             int, int, double, core::ThreadPool*);             \
  template void DualDepthRetrievalBackward<T>(const std::vector<T*>* const[2], T* const[2], T*, \
                                              const T* const[2], const T* const[2],            \
                                              const DualRetrieval<T>&, int, int, double,       \
                                              core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model
