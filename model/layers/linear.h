// model/layers/linear.h: a linear layer's pieces whose types differ by device, one name
// overloaded on the execution context like the ops. LinearForwardAcc: out (M,N) = inp (M,K)
// weight^T (weight (N,K)) into B::Acc (T on the CPU: ops::MatmulForward; fp32 on CUDA from T
// inputs: the mixed GEMM), for the small projections whose outputs are coefficients (HC/mHC,
// MUDDFormer, the MoE router). LinearBackward, as the layers (attention.cc, mlp.cc) run it:
//   CPU:  ops::MatmulBackward, the weight gradient in T (T == Acc);
//   CUDA: ops::MatmulBackwardInput and ops::MatmulBackwardWeightF32, the mixed-precision
//         forms: the weight gradient accumulates in fp32 (B::Acc) from T inputs.
#ifndef SATDAR_MODEL_LAYERS_LINEAR_H_
#define SATDAR_MODEL_LAYERS_LINEAR_H_

#include <cstdint>

#include <type_traits>

#include "absl/status/status.h"
#include "core/check.h"
#include "core/exec.h"
#include "model/ops.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include "core/dtype.h"
#include "core/ops/gemm_cuda.h"
#endif

namespace satdar::model::layers_internal {

template <typename T>
absl::Status LinearForwardAcc(const core::CpuExec& x, T* out, const T* inp, const T* weight,
                              int m, int n, int k) {
  return ops::MatmulForward(x, out, inp, weight, m, n, k);
}
#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
template <typename T>
absl::Status LinearForwardAcc(const core::CudaExec& x, float* out, const T* inp,
                              const T* weight, int m, int n, int k) {
  if (x.gemm == nullptr) {
    return absl::FailedPreconditionError("LinearForwardAcc: the CudaExec has no GEMM handle");
  }
  constexpr core::DType kDt = std::is_same_v<T, float> ? core::DType::kF32 : core::DType::kBF16;
  return x.gemm->GemmMixed(kDt, core::DType::kF32, false, true, m, n, k, 1.0f, inp, k, weight, k,
                           0.0f, out, n);
}
#endif

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
