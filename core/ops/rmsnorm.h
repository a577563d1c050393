// core/ops/rmsnorm.h: y = g * x / sqrt(mean(x^2) + eps) over the last dimension C.
// Used for the block norms (C = d) and per-head q/k norms (rows = B*T*NH, C = HS).
#ifndef SATDAR_CORE_OPS_RMSNORM_H_
#define SATDAR_CORE_OPS_RMSNORM_H_

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// out (N,C), rstd (N) = 1/sqrt(mean(x^2)+eps), inp (N,C), weight (C). out may alias inp.
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int n, int c, double eps,
                    ThreadPool* pool);

// dinp (N,C) += ..., dweight (C) += ... (dweight reduced deterministically). inp is the
// forward input, rstd its saved statistic.
template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int n, int c, ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_RMSNORM_H_
