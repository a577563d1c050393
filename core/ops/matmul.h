// core/ops/matmul.h: the linear layer without bias, weights stored [out, in] (nn.Linear).
#ifndef SATDAR_CORE_OPS_MATMUL_H_
#define SATDAR_CORE_OPS_MATMUL_H_

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// out (M,N) = inp (M,K) weight^T, weight (N,K). Overwrites out.
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, int m, int n, int k, ThreadPool* pool);

// dinp (M,K) += dout (M,N) weight (N,K); dweight (N,K) += dout^T inp. Either may be null.
template <typename T>
void MatmulBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int m,
                    int n, int k, ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_MATMUL_H_
