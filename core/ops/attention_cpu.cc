#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/gemm.h"

namespace satdar::core::cpu {

namespace {
// Query rows are processed in blocks; block [r0, r1) only needs keys [0, r1), so the upper
// triangle of the score matrix is never computed.
constexpr int kRowBlock = 64;
}  // namespace

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
      T* oh = out + static_cast<int64_t>(bi) * t * qs + h * hs;
      T* p = probs + i * t * t;
      for (int r0 = 0; r0 < t; r0 += kRowBlock) {
        const int r1 = std::min(t, r0 + kRowBlock), rows = r1 - r0;
        // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
        T* pb = p + static_cast<int64_t>(r0) * t;
        Gemm<T>(false, true, rows, r1, hs, scale, qh + static_cast<int64_t>(r0) * qs, qs, kh, ks,
                T(0), pb, t);
        for (int r = r0; r < r1; ++r) {
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
        // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
        Gemm<T>(false, false, rows, hs, r1, T(1), pb, t, vh, ks, T(0),
                oh + static_cast<int64_t>(r0) * qs, qs);
      }
    }
  });
}

template <typename T>
void AttentionCachedForward(T* out, const T* q, const T* k, const T* v, int b, int tn, int past,
                            int cap, int nh, int nkv, int hs, ThreadPool* pool) {
  const int group = nh / nkv;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int qs = nh * hs, ks = nkv * hs;
  const int width = past + tn;  // the score rows' stride: every key the last query sees
  // The same blocks, GEMMs and softmax as AttentionForward (so past = 0 gives its bits), the
  // scores of a block in a per-task buffer instead of the saved probabilities.
  pool->ParallelFor(static_cast<int64_t>(b) * nh, [&](int64_t i0, int64_t i1) {
    std::vector<T> p(static_cast<size_t>(std::min(tn, kRowBlock)) * width);
    for (int64_t i = i0; i < i1; ++i) {
      int bi = static_cast<int>(i / nh), h = static_cast<int>(i % nh), g = h / group;
      const T* qh = q + static_cast<int64_t>(bi) * tn * qs + h * hs;
      const T* kh = k + static_cast<int64_t>(bi) * cap * ks + g * hs;
      const T* vh = v + static_cast<int64_t>(bi) * cap * ks + g * hs;
      T* oh = out + static_cast<int64_t>(bi) * tn * qs + h * hs;
      for (int r0 = 0; r0 < tn; r0 += kRowBlock) {
        const int r1 = std::min(tn, r0 + kRowBlock), rows = r1 - r0, keys = past + r1;
        // S[r0:r1, 0:keys] = scale * Q[r0:r1] K[0:keys]^T
        Gemm<T>(false, true, rows, keys, hs, scale, qh + static_cast<int64_t>(r0) * qs, qs, kh,
                ks, T(0), p.data(), width);
        for (int r = r0; r < r1; ++r) {
          T* row = p.data() + static_cast<int64_t>(r - r0) * width;
          const int last = past + r;  // the query's own position
          T mx = row[0];
          for (int j = 1; j <= last; ++j) mx = row[j] > mx ? row[j] : mx;
          T sum = 0;
          for (int j = 0; j <= last; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          T inv = T(1) / sum;
          for (int j = 0; j <= last; ++j) row[j] *= inv;
          for (int j = last + 1; j < keys; ++j) row[j] = 0;
        }
        // O[r0:r1] = P[r0:r1, 0:keys] V[0:keys]
        Gemm<T>(false, false, rows, hs, keys, T(1), p.data(), width, vh, ks, T(0),
                oh + static_cast<int64_t>(r0) * qs, qs);
      }
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
    std::vector<T> dp(static_cast<size_t>(kRowBlock) * t);
    for (int64_t i = i0; i < i1; ++i) {
      int bi = static_cast<int>(i / nkv), g = static_cast<int>(i % nkv);
      int64_t kv_off = static_cast<int64_t>(bi) * t * ks + g * hs;
      for (int h = g * group; h < (g + 1) * group; ++h) {
        int64_t q_off = static_cast<int64_t>(bi) * t * qs + h * hs;
        const T* p = probs + (static_cast<int64_t>(bi) * nh + h) * t * t;
        for (int r0 = 0; r0 < t; r0 += kRowBlock) {
          const int r1 = std::min(t, r0 + kRowBlock), rows = r1 - r0;
          const T* pb = p + static_cast<int64_t>(r0) * t;
          const T* dob = dout + q_off + static_cast<int64_t>(r0) * qs;
          // dV[0:r1] += P[r0:r1, 0:r1]^T dO[r0:r1]
          Gemm<T>(true, false, r1, hs, rows, T(1), pb, t, dob, qs, T(1), dv + kv_off, ks);
          // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T
          Gemm<T>(false, true, rows, r1, hs, T(1), dob, qs, v + kv_off, ks, T(0), dp.data(), t);
          // dS = scale * P * (dP - rowsum(P * dP)), causal part only
          for (int r = r0; r < r1; ++r) {
            const T* pr = p + static_cast<int64_t>(r) * t;
            T* dr = dp.data() + static_cast<int64_t>(r - r0) * t;
            T dot = 0;
            for (int j = 0; j <= r; ++j) dot += pr[j] * dr[j];
            for (int j = 0; j <= r; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
            for (int j = r + 1; j < r1; ++j) dr[j] = 0;
          }
          // dQ[r0:r1] += dS K[0:r1] ; dK[0:r1] += dS^T Q[r0:r1]
          Gemm<T>(false, false, rows, hs, r1, T(1), dp.data(), t, k + kv_off, ks, T(1),
                  dq + q_off + static_cast<int64_t>(r0) * qs, qs);
          Gemm<T>(true, false, r1, hs, rows, T(1), dp.data(), t,
                  q + q_off + static_cast<int64_t>(r0) * qs, qs, T(1), dk + kv_off, ks);
        }
      }
    }
  });
}

template void AttentionForward<float>(float*, float*, const float*, const float*, const float*,
                                      int, int, int, int, int, ThreadPool*);
template void AttentionForward<double>(double*, double*, const double*, const double*,
                                       const double*, int, int, int, int, int, ThreadPool*);
template void AttentionCachedForward<float>(float*, const float*, const float*, const float*,
                                            int, int, int, int, int, int, int, ThreadPool*);
template void AttentionCachedForward<double>(double*, const double*, const double*,
                                             const double*, int, int, int, int, int, int, int,
                                             ThreadPool*);
template void AttentionBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int, int, int,
                                       int, int, ThreadPool*);
template void AttentionBackward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, const double*, const double*, int, int,
                                        int, int, int, ThreadPool*);

}  // namespace satdar::core::cpu
