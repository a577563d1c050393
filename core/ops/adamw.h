// core/ops/adamw.h: the AdamW update over flat buffers (decoupled weight decay, bias-corrected
// moments), the same arithmetic on the CPU and on CUDA.
//   m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
#ifndef SATDAR_CORE_OPS_ADAMW_H_
#define SATDAR_CORE_OPS_ADAMW_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"
#include "core/thread_pool.h"

namespace satdar::core {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  int64_t step = 1;        // 1-based, for bias correction
  double grad_scale = 1.0;  // multiplies every gradient first (clipping)
};

namespace cpu {
// param, grad, m, v: (N).
template <typename T>
void AdamWUpdate(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p,
                 ThreadPool* pool);
}  // namespace cpu

namespace cuda {
// Device pointers; fp32 master weights and moments. Launched on x.stream (nullptr: the legacy
// default stream); returns the launch error as a Status. Defined only in CUDA builds.
// ops::AdamWUpdate (core/ops/ops.h) names it beside the CPU one, which takes T for all four
// buffers (the CUDA one float only).
absl::Status AdamWUpdate(const CudaExec& x, float* param, const float* grad, float* m, float* v,
                         int64_t n, const AdamWParams& p);
}  // namespace cuda

}  // namespace satdar::core

#endif  // SATDAR_CORE_OPS_ADAMW_H_
