#include <cmath>

#include "core/ops/rope.h"

namespace satdar::core::cpu {

template <typename T>
void RopeTables(std::vector<T>* cos, std::vector<T>* sin, int seq_len, int head_size,
                double theta) {
  int half = head_size / 2;
  cos->resize(static_cast<size_t>(seq_len) * half);
  sin->resize(static_cast<size_t>(seq_len) * half);
  for (int t = 0; t < seq_len; ++t) {
    for (int i = 0; i < half; ++i) {
      double inv_freq = std::pow(theta, -2.0 * i / head_size);
      double angle = t * inv_freq;
      (*cos)[static_cast<size_t>(t) * half + i] = static_cast<T>(std::cos(angle));
      (*sin)[static_cast<size_t>(t) * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

namespace {
// sign = +1: forward rotation; sign = -1: transpose (backward).
template <typename T>
void Rotate(T* x, const T* cos, const T* sin, int b, int t, int nh, int hs, T sign,
            ThreadPool* pool) {
  int half = hs / 2;
  pool->ParallelFor(
      static_cast<int64_t>(b) * t,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          int pos = static_cast<int>(r % t);
          const T* c = cos + static_cast<size_t>(pos) * half;
          const T* s = sin + static_cast<size_t>(pos) * half;
          for (int h = 0; h < nh; ++h) {
            T* v = x + (r * nh + h) * hs;
            for (int i = 0; i < half; ++i) {
              T x1 = v[i], x2 = v[i + half];
              v[i] = x1 * c[i] - sign * x2 * s[i];
              v[i + half] = x2 * c[i] + sign * x1 * s[i];
            }
          }
        }
      },
      16);
}
}  // namespace

template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int b, int t, int nh, int hs, ThreadPool* pool) {
  Rotate<T>(x, cos, sin, b, t, nh, hs, T(1), pool);
}

template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int b, int t, int nh, int hs,
                  ThreadPool* pool) {
  Rotate<T>(dx, cos, sin, b, t, nh, hs, T(-1), pool);
}

template void RopeTables<float>(std::vector<float>*, std::vector<float>*, int, int, double);
template void RopeTables<double>(std::vector<double>*, std::vector<double>*, int, int, double);
template void RopeForward<float>(float*, const float*, const float*, int, int, int, int,
                                 ThreadPool*);
template void RopeForward<double>(double*, const double*, const double*, int, int, int, int,
                                  ThreadPool*);
template void RopeBackward<float>(float*, const float*, const float*, int, int, int, int,
                                  ThreadPool*);
template void RopeBackward<double>(double*, const double*, const double*, int, int, int, int,
                                   ThreadPool*);

}  // namespace satdar::core::cpu
