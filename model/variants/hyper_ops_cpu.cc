// HC's and mHC's ops on the CPU (hyper_ops.h): the reference the CUDA side is tested against,
// and what the CPU model runs. The loops are those that were inline in hyper_connections.cc,
// mhc.cc and hyper_streams.h: per element the same operations in the same order, so the
// models' results did not change bit for bit when they moved here. Rows are independent and
// run in parallel, except the coefficient backwards' sums across rows (the parameters'
// gradients), which run serially in row order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "model/layout_check.h"
#include "model/variants/hyper_ops.h"

namespace satdar::model {
// CheckDeviceSupport refuses configs with a copy of the CUDA side's limit (layout_check.h).
static_assert(kDeviceMaxHyperStreams == cuda::kMaxHyperStreams,
              "layout_check.h's kDeviceMaxHyperStreams must equal cuda::kMaxHyperStreams");
}  // namespace satdar::model

namespace satdar::model::cpu {

namespace {

constexpr int64_t kRowChunk = 16;  // the least rows a worker takes

template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace

template <typename T>
void MhcRms(T* rms, const T* h, int rows, int nc, double eps, core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* x = h + r * nc;
          T ss = 0;
          for (int e = 0; e < nc; ++e) ss += x[e] * x[e];
          rms[r] = T(1) / std::sqrt(ss / nc + static_cast<T>(eps));
        }
      },
      kRowChunk);
}

template <typename T>
void MhcCoefForward(T* coef, T* logits, const T* raw, int ld, const T* rms, const T* scale,
                    const T* base, int rows, int n, core::ThreadPool* pool) {
  SATDAR_CHECK(ld >= n * (n + 2)) << "ld " << ld << " < mixes of n = " << n;
  const int nn = n * n;
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* x = raw + r * ld;
          const T s = rms[r];
          T* c = coef + r * 2 * n;
          for (int j = 0; j < n; ++j) {
            c[j] = Sigmoid(scale[0] * x[j] * s + base[j]);
            c[n + j] = T(2) * Sigmoid(scale[1] * x[n + j] * s + base[n + j]);
          }
          T* z = logits + r * nn;
          for (int k = 0; k < nn; ++k) z[k] = scale[2] * x[2 * n + k] * s + base[2 * n + k];
        }
      },
      kRowChunk);
}

template <typename T>
void SinkhornForward(T* steps, const T* logits, int rows, int n, int iterations,
                     core::ThreadPool* pool) {
  const int nn = n * n, nsteps = 2 * iterations;
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* z = logits + r * nn;
          T* m = steps + r * nsteps * nn;
          // Row softmax.
          for (int j = 0; j < n; ++j) {
            T* row = m + j * n;
            T mx = -std::numeric_limits<T>::infinity();
            for (int k = 0; k < n; ++k) mx = std::max(mx, z[j * n + k]);
            T sum = 0;
            for (int k = 0; k < n; ++k) sum += row[k] = std::exp(z[j * n + k] - mx);
            for (int k = 0; k < n; ++k) row[k] /= sum;
          }
          // Column (odd steps) and row (even steps) normalisations.
          for (int step = 1; step < nsteps; ++step) {
            const T* a = m + (step - 1) * nn;
            T* b = m + step * nn;
            const bool column = step % 2 == 1;
            for (int q = 0; q < n; ++q) {
              T sum = 0;
              for (int t = 0; t < n; ++t) sum += column ? a[t * n + q] : a[q * n + t];
              for (int t = 0; t < n; ++t) {
                const int idx = column ? t * n + q : q * n + t;
                b[idx] = a[idx] / sum;
              }
            }
          }
        }
      },
      kRowChunk);
}

template <typename T>
void SinkhornBackward(T* dlogits, const T* dfinal, const T* steps, int rows, int n,
                      int iterations, core::ThreadPool* pool) {
  const int nn = n * n, nsteps = 2 * iterations;
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        std::vector<T> dm(nn), da(nn);  // per worker, reused across its rows
        for (int64_t r = r0; r < r1; ++r) {
          const T* m = steps + r * nsteps * nn;
          std::copy(dfinal + r * nn, dfinal + (r + 1) * nn, dm.begin());
          // Back through the normalisations: b = a / sum, so da = (db - <db, b>) / sum.
          for (int step = nsteps - 1; step >= 1; --step) {
            const T* a = m + (step - 1) * nn;
            const T* b = m + step * nn;
            const bool column = step % 2 == 1;
            for (int q = 0; q < n; ++q) {
              T sum = 0, dot = 0;
              for (int t = 0; t < n; ++t) {
                const int idx = column ? t * n + q : q * n + t;
                sum += a[idx];
                dot += dm[idx] * b[idx];
              }
              for (int t = 0; t < n; ++t) {
                const int idx = column ? t * n + q : q * n + t;
                da[idx] = (dm[idx] - dot) / sum;
              }
            }
            dm.swap(da);
          }
          // Then the row softmax.
          T* dz = dlogits + r * nn;
          for (int j = 0; j < n; ++j) {
            const T* row = m + j * n;
            T dot = 0;
            for (int k = 0; k < n; ++k) dot += dm[j * n + k] * row[k];
            for (int k = 0; k < n; ++k) dz[j * n + k] = row[k] * (dm[j * n + k] - dot);
          }
        }
      },
      kRowChunk);
}

template <typename T>
void MhcCoefBackward(T* draw, T* dz, T* grad_scale, T* grad_base, T* dh, const T* dcoef,
                     const T* dlogits, const T* coef, const T* raw, int ld, const T* rms,
                     const T* scale, const T* h, int rows, int n, int nc,
                     core::ThreadPool* pool) {
  const int mixes = n * (n + 2), nn = n * n;
  SATDAR_CHECK(ld >= mixes) << "ld " << ld << " < mixes " << mixes;
  // Serially in row order (the parameters' gradients are double sums over the rows): dz, the
  // sums, and draw before its rms factor (dz scale). Written as the loops were in mhc.cc, down
  // to dscale being a std::vector (a double[3] gave a different last bit in f64 under -O3
  // -march=native: GCC's default -ffp-contract=fast for C++ contracts products into sums as
  // it sees fit), so that the f32 and f64 results did not change when they moved here.
  std::vector<double> dscale(3, 0.0);
  std::vector<double> dbase(mixes, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = raw + r * ld;
    const T s = rms[r];
    const T* c = coef + r * 2 * n;
    const T* dc = dcoef + r * mixes;  // may be draw's row (ld == mixes): read before written
    T* z = dz + r * mixes;
    T* g = draw + r * ld;
    for (int j = 0; j < n; ++j) {
      const T pre = c[j];
      const T dzj = dc[j] * pre * (T(1) - pre);
      dscale[0] += static_cast<double>(dzj) * x[j] * s;
      dbase[j] += dzj;
      z[j] = dzj;
      g[j] = dzj * scale[0];
      const T post = c[n + j];  // 2 sigmoid(z): d/dz = post (1 - post / 2)
      const T dzp = dc[n + j] * post * (T(1) - post / 2);
      dscale[1] += static_cast<double>(dzp) * x[n + j] * s;
      dbase[n + j] += dzp;
      z[n + j] = dzp;
      g[n + j] = dzp * scale[1];
    }
    const T* dl = dlogits + r * nn;
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < n; ++k) {
        const int idx = 2 * n + j * n + k;
        const T dzk = dl[j * n + k];
        dscale[2] += static_cast<double>(dzk) * x[idx] * s;
        dbase[idx] += dzk;
        z[idx] = dzk;
        g[idx] = dzk * scale[2];
      }
    }
  }
  for (int k = 0; k < 3; ++k) grad_scale[k] += static_cast<T>(dscale[k]);
  for (int k = 0; k < mixes; ++k) grad_base[k] += static_cast<T>(dbase[k]);
  // The rms path, rows in parallel: mixes = raw rms with rms = 1 / sqrt(mean(h^2) + eps).
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* dr = draw + r * ld;
          const T* x = raw + r * ld;
          const T s = rms[r];
          T drms = 0;
          for (int k = 0; k < mixes; ++k) {
            drms += dr[k] * x[k];
            dr[k] *= s;
          }
          std::fill(dr + mixes, dr + ld, T(0));
          const T* hr = h + r * nc;
          T* dhr = dh + r * nc;
          const T rc = -drms * s * s * s / nc;
          for (int e = 0; e < nc; ++e) dhr[e] += rc * hr[e];
        }
      },
      kRowChunk);
}


// ---- The stream mixing.

namespace {

template <typename T>
T Pre(const HyperCoefs<T>& c, int64_t r, int j) {
  return c.pre[r * c.pre_token + j * c.pre_step];
}
template <typename T>
T& Post(const HyperCoefs<T>& c, int64_t r, int m) {
  return c.post[r * c.post_token + m];
}
template <typename T>
T& Res(const HyperCoefs<T>& c, int64_t r, int j, int m) {
  return c.res[r * c.res_token + j * c.res_row + m];
}

}  // namespace

template <typename T>
void StreamsBroadcast(T* out, const T* in, int rows, int n, int c, core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* src = in + r * c;
          for (int j = 0; j < n; ++j) std::copy(src, src + c, out + (r * n + j) * c);
        }
      },
      kRowChunk);
}

template <typename T>
void StreamsSum(T* out, const T* in, int rows, int n, int c, core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* g = out + r * c;
          std::fill(g, g + c, T(0));
          for (int j = 0; j < n; ++j) {
            const T* dj = in + (r * n + j) * c;
            for (int e = 0; e < c; ++e) g[e] += dj[e];
          }
        }
      },
      kRowChunk);
}

template <typename T>
void JoinStreams(T* hyper, const T* const* parts, int rows, int n, int c, core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int j = 0; j < n; ++j) {
            const T* src = parts[j] + r * c;
            std::copy(src, src + c, hyper + (r * n + j) * c);
          }
        }
      },
      kRowChunk);
}

template <typename T>
void SplitStreams(T* const* parts, const T* hyper, int rows, int n, int c, core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int j = 0; j < n; ++j) {
            const T* src = hyper + (r * n + j) * c;
            std::copy(src, src + c, parts[j] + r * c);
          }
        }
      },
      kRowChunk);
}

template <typename T>
void HyperWidthForward(T* u, const T* h, const HyperCoefs<T>& coefs, int rows, int n, int c,
                       core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* ur = u + r * c;
          std::fill(ur, ur + c, T(0));
          for (int j = 0; j < n; ++j) {
            const T am = Pre(coefs, r, j);
            const T* hj = h + (r * n + j) * c;
            for (int e = 0; e < c; ++e) ur[e] += am * hj[e];
          }
        }
      },
      kRowChunk);
}

template <typename T>
void HyperDepthForward(T* h_out, const T* h, const T* y, const HyperCoefs<T>& coefs, int rows,
                       int n, int c, core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* yr = y + r * c;
          for (int m = 0; m < n; ++m) {
            T* out = h_out + (r * n + m) * c;
            const T bm = Post(coefs, r, m);
            for (int e = 0; e < c; ++e) out[e] = bm * yr[e];
            for (int j = 0; j < n; ++j) {
              const T ar = Res(coefs, r, j, m);
              const T* hj = h + (r * n + j) * c;
              for (int e = 0; e < c; ++e) out[e] += ar * hj[e];
            }
          }
        }
      },
      kRowChunk);
}

template <typename T>
void HyperDepthBackward(T* dy, T* dh, const HyperCoefs<T>& dcoefs, const T* g, const T* y,
                        const T* h, const HyperCoefs<T>& coefs, int rows, int n, int c,
                        core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* yr = y + r * c;
          T* dyr = dy + r * c;
          std::fill(dyr, dyr + c, T(0));
          std::fill(dh + r * n * c, dh + (r + 1) * n * c, T(0));
          for (int m = 0; m < n; ++m) {
            const T* gm = g + (r * n + m) * c;
            const T bm = Post(coefs, r, m);
            T dot = 0;
            for (int e = 0; e < c; ++e) {
              dyr[e] += bm * gm[e];
              dot += yr[e] * gm[e];
            }
            Post(dcoefs, r, m) = dot;
            for (int j = 0; j < n; ++j) {
              const T* hj = h + (r * n + j) * c;
              T* dhj = dh + (r * n + j) * c;
              const T ar = Res(coefs, r, j, m);
              T dar = 0;
              for (int e = 0; e < c; ++e) {
                dar += hj[e] * gm[e];
                dhj[e] += ar * gm[e];
              }
              Res(dcoefs, r, j, m) = dar;
            }
          }
        }
      },
      kRowChunk);
}

template <typename T>
void HyperWidthBackward(T* dh, const HyperCoefs<T>& dcoefs, const T* du, const T* h,
                        const HyperCoefs<T>& coefs, int rows, int n, int c,
                        core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* dur = du + r * c;
          for (int j = 0; j < n; ++j) {
            const T* hj = h + (r * n + j) * c;
            T* dhj = dh + (r * n + j) * c;
            const T am = Pre(coefs, r, j);
            T dam = 0;
            for (int e = 0; e < c; ++e) {
              dam += hj[e] * dur[e];
              dhj[e] += am * dur[e];
            }
            dcoefs.pre[r * dcoefs.pre_token + j * dcoefs.pre_step] = dam;
          }
        }
      },
      kRowChunk);
}

// ---- HC's coefficients.

template <typename T>
void HcCoefForward(T* coef, T* ta, int lda, T* tb, int ldb, const T* static_alpha,
                   const T* static_beta, const T* alpha_scale, const T* beta_scale, int rows,
                   int n, core::ThreadPool* pool) {
  SATDAR_CHECK(lda >= n + 1 && ldb >= 1) << "lda " << lda << ", ldb " << ldb << ", n " << n;
  const int cols = n * (n + 2);
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* cf = coef + r * cols;
          for (int j = 0; j < n; ++j) {
            T* a = ta + (r * n + j) * lda;
            for (int k = 0; k <= n; ++k) {
              a[k] = std::tanh(a[k]);
              cf[j * (n + 1) + k] = alpha_scale[0] * a[k] + static_alpha[j * (n + 1) + k];
            }
            T& b = tb[(r * n + j) * ldb];
            b = std::tanh(b);
            cf[n * (n + 1) + j] = beta_scale[0] * b + static_beta[j];
          }
        }
      },
      kRowChunk);
}

template <typename T>
void HcCoefBackward(T* dta, T* dtb, T* grad_static_alpha, T* grad_static_beta,
                    T* grad_alpha_scale, T* grad_beta_scale, const T* dcoef, const T* ta,
                    int lda, const T* tb, int ldb, const T* alpha_scale, const T* beta_scale,
                    int rows, int n, core::ThreadPool* pool) {
  (void)pool;  // one serial pass: the parameters' gradients are sums in row order
  SATDAR_CHECK(lda >= n + 1 && ldb >= 1) << "lda " << lda << ", ldb " << ldb << ", n " << n;
  const int cols = n * (n + 2);
  // a = s_a tanh(za) + static, B = s_b tanh(zb) + static.
  const T sa = alpha_scale[0], sb = beta_scale[0];
  double dsa = 0, dsb = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* dc = dcoef + r * cols;
    for (int j = 0; j < n; ++j) {
      const int64_t row = r * n + j;
      for (int k = 0; k <= n; ++k) {
        const T da = dc[j * (n + 1) + k], t = ta[row * lda + k];
        grad_static_alpha[j * (n + 1) + k] += da;
        dsa += static_cast<double>(da) * t;
        dta[row * lda + k] = da * sa * (T(1) - t * t);
      }
      const T db = dc[n * (n + 1) + j], t = tb[row * ldb];
      grad_static_beta[j] += db;
      dsb += static_cast<double>(db) * t;
      dtb[row * ldb] = db * sb * (T(1) - t * t);
    }
  }
  grad_alpha_scale[0] += static_cast<T>(dsa);
  grad_beta_scale[0] += static_cast<T>(dsb);
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template void MhcRms<T>(T*, const T*, int, int, double, core::ThreadPool*);                  \
  template void MhcCoefForward<T>(T*, T*, const T*, int, const T*, const T*, const T*, int,    \
                                  int, core::ThreadPool*);                                     \
  template void SinkhornForward<T>(T*, const T*, int, int, int, core::ThreadPool*);            \
  template void SinkhornBackward<T>(T*, const T*, const T*, int, int, int, core::ThreadPool*); \
  template void MhcCoefBackward<T>(T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                   int, const T*, const T*, const T*, int, int, int,           \
                                   core::ThreadPool*);                                         \
  template void StreamsBroadcast<T>(T*, const T*, int, int, int, core::ThreadPool*);           \
  template void StreamsSum<T>(T*, const T*, int, int, int, core::ThreadPool*);                 \
  template void JoinStreams<T>(T*, const T* const*, int, int, int, core::ThreadPool*);         \
  template void SplitStreams<T>(T* const*, const T*, int, int, int, core::ThreadPool*);        \
  template void HyperWidthForward<T>(T*, const T*, const HyperCoefs<T>&, int, int, int,        \
                                     core::ThreadPool*);                                       \
  template void HyperDepthForward<T>(T*, const T*, const T*, const HyperCoefs<T>&, int, int,   \
                                     int, core::ThreadPool*);                                  \
  template void HyperDepthBackward<T>(T*, T*, const HyperCoefs<T>&, const T*, const T*,        \
                                      const T*, const HyperCoefs<T>&, int, int, int,           \
                                      core::ThreadPool*);                                      \
  template void HyperWidthBackward<T>(T*, const HyperCoefs<T>&, const T*, const T*,            \
                                      const HyperCoefs<T>&, int, int, int, core::ThreadPool*); \
  template void HcCoefForward<T>(T*, T*, int, T*, int, const T*, const T*, const T*, const T*, \
                                 int, int, core::ThreadPool*);                                 \
  template void HcCoefBackward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, int, const T*,   \
                                  int, const T*, const T*, int, int, core::ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cpu
