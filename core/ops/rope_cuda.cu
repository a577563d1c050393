// CUDA RoPE (see rope.h and rope_cpu.cc): one thread per rotated pair (x_i, x_{i+HS/2}),
// fp32 arithmetic on the fp32 cos/sin tables; the backward is the transpose rotation.
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

// sign = +1: forward rotation; sign = -1: its transpose (backward).
template <typename T>
__global__ void RotateKernel(T* x, const float* cos, const float* sin, int t, int nh, int hs,
                             int64_t pairs, float sign) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= pairs) return;
  const int half = hs / 2;
  const int i = static_cast<int>(idx % half);
  const int64_t head_row = idx / half;  // (b*T + t) * NH + h
  const int pos = static_cast<int>((head_row / nh) % t);
  const float c = cos[static_cast<int64_t>(pos) * half + i];
  const float s = sin[static_cast<int64_t>(pos) * half + i];
  T* v = x + head_row * hs;
  const float x1 = ToF(v[i]), x2 = ToF(v[i + half]);
  v[i] = FromF<T>(x1 * c - sign * x2 * s);
  v[i + half] = FromF<T>(x2 * c + sign * x1 * s);
}

template <typename T>
cudaError_t Rotate(T* x, const float* cos, const float* sin, int b, int t, int nh, int hs,
                   float sign, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(b) * t * nh * (hs / 2);
  if (pairs <= 0) return cudaSuccess;
  const int64_t blocks = (pairs + kBlockSize - 1) / kBlockSize;
  return Launch("RotateKernel", RotateKernel<T>, dim3(static_cast<unsigned>(blocks)),
                dim3(kBlockSize), 0, stream, x, cos, sin, t, nh, hs, pairs, sign);
}
}  // namespace

template <typename T>
absl::Status RopeForward(const CudaExec& exec, T* x, const float* cos, const float* sin, int b,
                         int t, int nh, int hs) {
  SATDAR_CUDA_RETURN_IF_ERROR(Rotate<T>(x, cos, sin, b, t, nh, hs, 1.0f, exec.stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status RopeBackward(const CudaExec& x, T* dx, const float* cos, const float* sin, int b,
                          int t, int nh, int hs) {
  SATDAR_CUDA_RETURN_IF_ERROR(Rotate<T>(dx, cos, sin, b, t, nh, hs, -1.0f, x.stream));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template absl::Status RopeForward<T>(const CudaExec&, T*, const float*, const float*, int, int,  \
                                       int, int);                                                  \
  template absl::Status RopeBackward<T>(const CudaExec&, T*, const float*, const float*, int, int, \
                                        int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
