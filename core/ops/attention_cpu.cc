#include <cmath>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/gemm.h"

namespace satdar::core::cpu {

template <typename T>
void AttentionForward(T* out, T* probs, const T* q, const T* k, const T* v, int b, int t, int nh,
                      int nkv, int hs, ThreadPool* pool) {
  const int group = nh / nkv;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int qs = nh * hs, ks = nkv * hs;  // row strides
  pool->ParallelFor(static_cast<int64_t>(b) * nh, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int bi = static_cast<int>(i / nh), h = static_cast<int>(i % nh), g = h / group;
      const T* qh = q + static_cast<int64_t>(bi) * t * qs + h * hs;
      const T* kh = k + static_cast<int64_t>(bi) * t * ks + g * hs;
      const T* vh = v + static_cast<int64_t>(bi) * t * ks + g * hs;
      T* p = probs + i * t * t;
      // S = Q K^T (T,T); only the lower triangle is used.
      Gemm<T>(false, true, t, t, hs, scale, qh, qs, kh, ks, T(0), p, t);
      for (int r = 0; r < t; ++r) {
        T* row = p + static_cast<int64_t>(r) * t;
        T mx = row[0];
        for (int j = 1; j <= r; ++j) mx = row[j] > mx ? row[j] : mx;
        T sum = 0;
        for (int j = 0; j <= r; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        T inv = T(1) / sum;
        for (int j = 0; j <= r; ++j) row[j] *= inv;
        for (int j = r + 1; j < t; ++j) row[j] = 0;
      }
      // O = P V (T,HS)
      Gemm<T>(false, false, t, hs, t, T(1), p, t, vh, ks, T(0),
              out + static_cast<int64_t>(bi) * t * qs + h * hs, qs);
    }
  });
}

template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* probs, const T* q, const T* k,
                       const T* v, int b, int t, int nh, int nkv, int hs, ThreadPool* pool) {
  const int group = nh / nkv;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int qs = nh * hs, ks = nkv * hs;
  // One task per (batch, KV head): the query heads of a group all write the same dk/dv.
  pool->ParallelFor(static_cast<int64_t>(b) * nkv, [&](int64_t i0, int64_t i1) {
    std::vector<T> dp(static_cast<size_t>(t) * t);
    for (int64_t i = i0; i < i1; ++i) {
      int bi = static_cast<int>(i / nkv), g = static_cast<int>(i % nkv);
      int64_t kv_off = static_cast<int64_t>(bi) * t * ks + g * hs;
      for (int h = g * group; h < (g + 1) * group; ++h) {
        int64_t q_off = static_cast<int64_t>(bi) * t * qs + h * hs;
        const T* p = probs + (static_cast<int64_t>(bi) * nh + h) * t * t;
        // dV += P^T dO
        Gemm<T>(true, false, t, hs, t, T(1), p, t, dout + q_off, qs, T(1), dv + kv_off, ks);
        // dP = dO V^T
        Gemm<T>(false, true, t, t, hs, T(1), dout + q_off, qs, v + kv_off, ks, T(0), dp.data(), t);
        // dS = scale * P * (dP - rowsum(P * dP))
        for (int r = 0; r < t; ++r) {
          const T* pr = p + static_cast<int64_t>(r) * t;
          T* dr = dp.data() + static_cast<int64_t>(r) * t;
          T dot = 0;
          for (int j = 0; j <= r; ++j) dot += pr[j] * dr[j];
          for (int j = 0; j <= r; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
          for (int j = r + 1; j < t; ++j) dr[j] = 0;
        }
        // dQ += dS K ; dK += dS^T Q
        Gemm<T>(false, false, t, hs, t, T(1), dp.data(), t, k + kv_off, ks, T(1), dq + q_off, qs);
        Gemm<T>(true, false, t, hs, t, T(1), dp.data(), t, q + q_off, qs, T(1), dk + kv_off, ks);
      }
    }
  });
}

template void AttentionForward<float>(float*, float*, const float*, const float*, const float*,
                                      int, int, int, int, int, ThreadPool*);
template void AttentionForward<double>(double*, double*, const double*, const double*,
                                       const double*, int, int, int, int, int, ThreadPool*);
template void AttentionBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int, int, int,
                                       int, int, ThreadPool*);
template void AttentionBackward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, const double*, const double*, int, int,
                                        int, int, int, ThreadPool*);

}  // namespace satdar::core::cpu
