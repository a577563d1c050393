#include <cmath>

#include "core/ops/cross_entropy.h"

namespace satdar::core::cpu {

namespace {
template <typename T>
T LogSumExp(const T* x, int v, T* max_out) {
  T mx = x[0];
  for (int j = 1; j < v; ++j) mx = x[j] > mx ? x[j] : mx;
  T sum = 0;
  for (int j = 0; j < v; ++j) sum += std::exp(x[j] - mx);
  *max_out = mx;
  return mx + std::log(sum);
}
}  // namespace

template <typename T>
void CrossEntropyForward(T* losses, const T* logits, const int32_t* targets, int n, int v,
                         ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const T* x = logits + i * v;
          T mx;
          losses[i] = LogSumExp(x, v, &mx) - x[targets[i]];
        }
      },
      16);
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, T dloss, int n,
                          int v, ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const T* x = logits + i * v;
          T* d = dlogits + i * v;
          T mx;
          T lse = LogSumExp(x, v, &mx);
          for (int j = 0; j < v; ++j) d[j] = dloss * std::exp(x[j] - lse);
          d[targets[i]] -= dloss;
        }
      },
      16);
}

template void CrossEntropyForward<float>(float*, const float*, const int32_t*, int, int,
                                         ThreadPool*);
template void CrossEntropyForward<double>(double*, const double*, const int32_t*, int, int,
                                          ThreadPool*);
template void CrossEntropyBackward<float>(float*, const float*, const int32_t*, float, int, int,
                                          ThreadPool*);
template void CrossEntropyBackward<double>(double*, const double*, const int32_t*, double, int,
                                           int, ThreadPool*);

}  // namespace satdar::core::cpu
