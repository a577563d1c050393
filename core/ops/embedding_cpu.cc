#include <cstring>

#include "core/ops/embedding.h"

namespace satdar::core::cpu {

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int n, int c,
                      ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          std::memcpy(out + i * c, table + static_cast<int64_t>(tokens[i]) * c, c * sizeof(T));
        }
      },
      64);
}

template <typename T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int n, int c,
                       ThreadPool* pool) {
  pool->ParallelFor(
      c,
      [&](int64_t c0, int64_t c1) {
        for (int i = 0; i < n; ++i) {
          T* row = dtable + static_cast<int64_t>(tokens[i]) * c;
          const T* g = dout + static_cast<int64_t>(i) * c;
          for (int64_t j = c0; j < c1; ++j) row[j] += g[j];
        }
      },
      16);
}

template void EmbeddingForward<float>(float*, const int32_t*, const float*, int, int, ThreadPool*);
template void EmbeddingForward<double>(double*, const int32_t*, const double*, int, int,
                                       ThreadPool*);
template void EmbeddingBackward<float>(float*, const float*, const int32_t*, int, int,
                                       ThreadPool*);
template void EmbeddingBackward<double>(double*, const double*, const int32_t*, int, int,
                                        ThreadPool*);

}  // namespace satdar::core::cpu
