// CUDA SwiGLU on fused [gate | up] rows (see swiglu.h and swiglu_cpu.cc): one thread per
// output element, fp32 arithmetic. The backward overwrites dgate_up, as the CPU one does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/exec.h"
#include "core/ops/cuda_ops.h"

namespace satdar::core::cuda {

namespace {
constexpr int kBlockSize = 256;

using namespace ::satdar::core::cuda::device;  // ToF, FromF, Ld, St, WarpSum (bf16.cuh)

template <typename T>
__global__ void SwigluForwardKernel(T* out, const T* gate_up, int f, int64_t total) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t r = idx / f;
  const int j = static_cast<int>(idx % f);
  const float g = ToF(gate_up[r * 2 * f + j]);
  const float u = ToF(gate_up[r * 2 * f + f + j]);
  out[idx] = FromF<T>(g / (1.0f + expf(-g)) * u);
}

template <typename T>
__global__ void SwigluBackwardKernel(T* dgate_up, const T* dout, const T* gate_up, int f,
                                     int64_t total) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t r = idx / f;
  const int j = static_cast<int>(idx % f);
  const float g = ToF(gate_up[r * 2 * f + j]);
  const float u = ToF(gate_up[r * 2 * f + f + j]);
  const float d = ToF(dout[idx]);
  const float s = 1.0f / (1.0f + expf(-g));
  dgate_up[r * 2 * f + f + j] = FromF<T>(d * g * s);
  dgate_up[r * 2 * f + j] = FromF<T>(d * u * s * (1.0f + g * (1.0f - s)));
}

unsigned Blocks(int64_t total) {
  return static_cast<unsigned>((total + kBlockSize - 1) / kBlockSize);
}
}  // namespace

template <typename T>
absl::Status SwigluForward(const CudaExec& x, T* out, const T* gate_up, int n, int f) {
  const int64_t total = static_cast<int64_t>(n) * f;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SwigluForwardKernel", SwigluForwardKernel<T>,
                                     dim3(Blocks(total)), dim3(kBlockSize), 0, x.stream, out,
                                     gate_up, f, total));
  return absl::OkStatus();
}

template <typename T>
absl::Status SwigluBackward(const CudaExec& x, T* dgate_up, const T* dout, const T* gate_up, int n,
                            int f) {
  const int64_t total = static_cast<int64_t>(n) * f;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SwigluBackwardKernel", SwigluBackwardKernel<T>,
                                     dim3(Blocks(total)), dim3(kBlockSize), 0, x.stream, dgate_up,
                                     dout, gate_up, f, total));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template absl::Status SwigluForward<T>(const CudaExec&, T*, const T*, int, int);                 \
  template absl::Status SwigluBackward<T>(const CudaExec&, T*, const T*, const T*, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
