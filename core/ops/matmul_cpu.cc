#include "core/ops/gemm.h"
#include "core/ops/matmul.h"

namespace satdar::core::cpu {

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, int m, int n, int k, ThreadPool* pool) {
  ParallelGemm<T>(pool, false, true, m, n, k, T(1), inp, k, weight, k, T(0), out, n);
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int m,
                    int n, int k, ThreadPool* pool) {
  if (dinp != nullptr) {
    ParallelGemm<T>(pool, false, false, m, k, n, T(1), dout, n, weight, k, T(1), dinp, k);
  }
  if (dweight != nullptr) {
    ParallelGemm<T>(pool, true, false, n, k, m, T(1), dout, n, inp, k, T(1), dweight, k);
  }
}

template void MatmulForward<float>(float*, const float*, const float*, int, int, int, ThreadPool*);
template void MatmulForward<double>(double*, const double*, const double*, int, int, int,
                                    ThreadPool*);
template void MatmulBackward<float>(float*, float*, const float*, const float*, const float*, int,
                                    int, int, ThreadPool*);
template void MatmulBackward<double>(double*, double*, const double*, const double*,
                                     const double*, int, int, int, ThreadPool*);

}  // namespace satdar::core::cpu
