// model/layers/linear.h: the backward of a linear layer as the layers (attention.cc, mlp.cc)
// run it on each device, one name overloaded on the execution context like the ops:
//   CPU:  ops::MatmulBackward, the weight gradient in T (T == Acc);
//   CUDA: ops::MatmulBackwardInput and ops::MatmulBackwardWeightF32, the mixed-precision
//         forms: the weight gradient accumulates in fp32 (B::Acc) from T inputs.
#ifndef SATDAR_MODEL_LAYERS_LINEAR_H_
#define SATDAR_MODEL_LAYERS_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/check.h"
#include "core/exec.h"
#include "model/ops.h"

namespace satdar::model::layers_internal {

// inp (M,K), weight (N,K), dout (M,N): dinp (M,K) += dout weight (overwrite: dinp = dout
// weight), dweight (N,K) += dout^T inp.
template <typename T>
absl::Status LinearBackward(const core::CpuExec& x, T* dinp, T* dweight, const T* dout,
                            const T* inp, const T* weight, int m, int n, int k, bool overwrite) {
  if (overwrite) SATDAR_RETURN_IF_ERROR(ops::Zero(x, dinp, static_cast<int64_t>(m) * k));
  return ops::MatmulBackward(x, dinp, dweight, dout, inp, weight, m, n, k);
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
template <typename T>
absl::Status LinearBackward(const core::CudaExec& x, T* dinp, float* dweight, const T* dout,
                            const T* inp, const T* weight, int m, int n, int k, bool overwrite) {
  SATDAR_RETURN_IF_ERROR(
      ops::MatmulBackwardInput(x, dinp, dout, weight, m, n, k, overwrite ? 0.0f : 1.0f));
  return ops::MatmulBackwardWeightF32(x, dweight, dout, inp, m, n, k);
}
#endif

}  // namespace satdar::model::layers_internal

#endif  // SATDAR_MODEL_LAYERS_LINEAR_H_
