#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/ops/vocab_parallel.h"

namespace satdar::core::cpu {

template <typename T>
void VocabSliceEmbeddingForward(T* out, const int32_t* tokens, const T* table, int v0, int vl,
                                int n, int c, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int id = tokens[i] - v0;
          T* row = out + i * c;
          if (id >= 0 && id < vl) {
            std::memcpy(row, table + static_cast<int64_t>(id) * c, c * sizeof(T));
          } else {
            std::fill(row, row + c, T(0));
          }
        }
      },
      64);
}

template <typename T>
void VocabSliceEmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int v0, int vl,
                                 int n, int c, ThreadPool* pool) {
  pool->ParallelFor(
      c,
      [&](int64_t c0, int64_t c1) {
        for (int i = 0; i < n; ++i) {
          const int id = tokens[i] - v0;
          if (id < 0 || id >= vl) continue;
          T* row = dtable + static_cast<int64_t>(id) * c;
          const T* g = dout + static_cast<int64_t>(i) * c;
          for (int64_t j = c0; j < c1; ++j) row[j] += g[j];
        }
      },
      16);
}

template <typename T>
void VocabParallelRowMax(T* row_max, const T* logits, int n, int vl, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const T* row = logits + i * vl;
          row_max[i] = *std::max_element(row, row + vl);
        }
      },
      16);
}

template <typename T>
void VocabParallelSumExp(T* sum_exp, T* target_logit, const T* logits, const T* row_max,
                         const int32_t* targets, int v0, int n, int vl, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const T* row = logits + i * vl;
          double s = 0;
          for (int j = 0; j < vl; ++j) s += std::exp(static_cast<double>(row[j] - row_max[i]));
          sum_exp[i] = static_cast<T>(s);
          const int id = targets[i] - v0;
          target_logit[i] = id >= 0 && id < vl ? row[id] : T(0);
        }
      },
      16);
}

template <typename T>
void VocabParallelLoss(T* losses, T* lse, const T* row_max, const T* sum_exp,
                       const T* target_logit, int n, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          lse[i] = row_max[i] + static_cast<T>(std::log(static_cast<double>(sum_exp[i])));
          losses[i] = lse[i] - target_logit[i];
        }
      },
      256);
}

template <typename T>
void VocabParallelCrossEntropyBackward(T* dlogits, const T* logits, const T* lse,
                                       const int32_t* targets, T scale, int v0, int n, int vl,
                                       ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const T* x = logits + i * vl;
          T* d = dlogits + i * vl;
          for (int j = 0; j < vl; ++j) d[j] = scale * std::exp(x[j] - lse[i]);
          const int id = targets[i] - v0;
          if (id >= 0 && id < vl) d[id] -= scale;
        }
      },
      16);
}

template <typename T>
void MaskPaddedVocab(T* logits, int n, int vl, int vtrue, ThreadPool* pool) {
  if (vtrue >= vl) return;
  const int first = std::max(vtrue, 0);
  const T none = -std::numeric_limits<T>::infinity();
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          T* row = logits + i * vl;
          std::fill(row + first, row + vl, none);
        }
      },
      64);
}

#define SATDAR_INSTANTIATE(T)                                                                   \
  template void VocabSliceEmbeddingForward<T>(T*, const int32_t*, const T*, int, int, int, int, \
                                              ThreadPool*);                                     \
  template void VocabSliceEmbeddingBackward<T>(T*, const T*, const int32_t*, int, int, int, int, \
                                               ThreadPool*);                                    \
  template void VocabParallelRowMax<T>(T*, const T*, int, int, ThreadPool*);                    \
  template void VocabParallelSumExp<T>(T*, T*, const T*, const T*, const int32_t*, int, int,    \
                                       int, ThreadPool*);                                       \
  template void VocabParallelLoss<T>(T*, T*, const T*, const T*, const T*, int, ThreadPool*);   \
  template void VocabParallelCrossEntropyBackward<T>(T*, const T*, const T*, const int32_t*, T, \
                                                     int, int, int, ThreadPool*);               \
  template void MaskPaddedVocab<T>(T*, int, int, int, ThreadPool*);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(double)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cpu
