// model/variants/dar_ops.h: the arithmetic of DAR's mix and write (variants/dar.cc decides the
// data flow), one header for both devices: cpu:: (dar_ops_cpu.cc, the readable reference, f32
// and f64) and cuda:: (dar_ops_cuda.cu, f32 and bf16 with fp32 arithmetic). Tested against
// each other by dar_ops_test (the CUDA side tag gpu), the CPU side by f64 finite differences.
//
// Scalars (mix logits [2], transport [1], write gates [2]) are read through pointers into the
// parameter buffer (on the GPU: the fp32 master weights, so no step waits for the host); their
// gradients are accumulated (+=). n elements each; rows of (B*T, C) flattened.
//   mix:   u = c0 r0 + c1 r1, (c0, c1) = softmax(mix)
//   write: q0 = rho p0 + (1-rho) p1 + b0 y ; q1 = (1-rho) p0 + rho p1 + b1 y,
//          rho = sigmoid(transport), b_s = 2 sigmoid(write[s]); p0, p1 null: no partial (0)
#ifndef SATDAR_MODEL_VARIANTS_DAR_OPS_H_
#define SATDAR_MODEL_VARIANTS_DAR_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace satdar::core {
class ThreadPool;
}  // namespace satdar::core

namespace satdar::model::cpu {

// The scalars in double, as every op here and the statistics use them: (c0, c1) =
// softmax(mix); rho = sigmoid(transport[0]); b_s = 2 sigmoid(write[s]).
template <typename T>
void DarMixCoefficients(const T* mix, double* c0, double* c1);
template <typename T>
void DarWriteCoefficients(const T* transport, const T* write, double* rho, double* b0,
                          double* b1);

template <typename T>
void DarMixForward(T* u, const T* r0, const T* r1, const T* mix, int64_t n,
                   core::ThreadPool* pool);
// dr0 = c0 du, dr1 = c1 du (overwritten); grad_mix[s] += c_s (<r_s, du> - sum_t c_t <r_t, du>).
template <typename T>
void DarMixBackward(T* dr0, T* dr1, const T* du, const T* r0, const T* r1, const T* mix,
                    T* grad_mix, int64_t n, core::ThreadPool* pool);
template <typename T>
void DarWriteForward(T* q0, T* q1, const T* p0, const T* p1, const T* y, const T* transport,
                     const T* write, int64_t n, core::ThreadPool* pool);
// From g0, g1 (the gradients of q0, q1): dy = b0 g0 + b1 g1 (overwritten); dp0, dp1
// overwritten (0 without partials; they may alias g0, g1); grad_write[s] += b_s' <y, g_s>;
// grad_transport += rho (1 - rho) <p0 - p1, g0 - g1>.
template <typename T>
void DarWriteBackward(T* dy, T* dp0, T* dp1, const T* g0, const T* g1, const T* y, const T* p0,
                      const T* p1, const T* transport, const T* write, T* grad_transport,
                      T* grad_write, int64_t n, core::ThreadPool* pool);

}  // namespace satdar::model::cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace satdar::model::cuda {

// Reductions run over the fixed grid of core/cuda/reduce_grid.h (bit-identical run to run);
// the backwards take their scratch (fp32, 3 * core::cuda::kReduceBlocks at most) from
// x.workspace (FailedPrecondition without one).

// T is float or __nv_bfloat16; scalars and their gradients fp32. Enqueued on x.stream.
template <typename T>
absl::Status DarMixForward(const core::CudaExec& x, T* u, const T* r0, const T* r1,
                           const float* mix, int64_t n);
template <typename T>
absl::Status DarMixBackward(const core::CudaExec& x, T* dr0, T* dr1, const T* du, const T* r0,
                            const T* r1, const float* mix, float* grad_mix, int64_t n);
template <typename T>
absl::Status DarWriteForward(const core::CudaExec& x, T* q0, T* q1, const T* p0, const T* p1,
                             const T* y, const float* transport, const float* write, int64_t n);
template <typename T>
absl::Status DarWriteBackward(const core::CudaExec& x, T* dy, T* dp0, T* dp1, const T* g0,
                              const T* g1, const T* y, const T* p0, const T* p1,
                              const float* transport, const float* write, float* grad_transport,
                              float* grad_write, int64_t n);

}  // namespace satdar::model::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(x, ...) with x a core::CpuExec (the cpu:: reference,
// rows over x.pool) or a core::CudaExec (the cuda:: launcher).
namespace satdar::model::ops {

template <typename T>
inline absl::Status DarMixForward(const core::CpuExec& x, T* u, const T* r0, const T* r1,
                                  const T* mix, int64_t n) {
  cpu::DarMixForward(u, r0, r1, mix, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DarMixBackward(const core::CpuExec& x, T* dr0, T* dr1, const T* du,
                                   const T* r0, const T* r1, const T* mix, T* grad_mix,
                                   int64_t n) {
  cpu::DarMixBackward(dr0, dr1, du, r0, r1, mix, grad_mix, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DarWriteForward(const core::CpuExec& x, T* q0, T* q1, const T* p0,
                                    const T* p1, const T* y, const T* transport, const T* write,
                                    int64_t n) {
  cpu::DarWriteForward(q0, q1, p0, p1, y, transport, write, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status DarWriteBackward(const core::CpuExec& x, T* dy, T* dp0, T* dp1, const T* g0,
                                     const T* g1, const T* y, const T* p0, const T* p1,
                                     const T* transport, const T* write, T* grad_transport,
                                     T* grad_write, int64_t n) {
  cpu::DarWriteBackward(dy, dp0, dp1, g0, g1, y, p0, p1, transport, write, grad_transport,
                        grad_write, n, x.pool);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::DarMixBackward;
using cuda::DarMixForward;
using cuda::DarWriteBackward;
using cuda::DarWriteForward;
#endif

}  // namespace satdar::model::ops

#endif  // SATDAR_MODEL_VARIANTS_DAR_OPS_H_
