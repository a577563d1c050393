// SATFormer's value gate on the GPU (satformer_ops.h; satformer_ops_cpu.cc is the reference).
// The gate and its backward run one block per token: its warps take the token's NKV gates (a
// lane-strided dot product each, reduced by shuffles in a fixed order). The mix is elementwise.
// dW sums over the tokens in a column-tiled kernel with a fixed order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "model/variants/satformer_ops.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: ToF, FromF, Ld, St, WarpSum, GridBlocks
using ::satdar::core::cuda::Launch;

constexpr int kRowThreads = 256;  // the most threads per token block (a multiple of 32)
constexpr int kThreads = 256;     // elementwise blocks
constexpr int kTileCols = 32;
constexpr int kTileRows = 8;

// Threads per token block: a warp per gate, or a thread per element of `width`, at most
// kRowThreads. Results do not depend on it: each gate's sum runs over its warp's lanes in a
// fixed pattern, and each element is one thread's.
unsigned RowThreads(int nkv, int width) {
  const int warps = nkv > (width + 31) / 32 ? nkv : (width + 31) / 32;
  return static_cast<unsigned>(warps * 32 < kRowThreads ? warps * 32 : kRowThreads);
}

template <typename T>
__global__ void GateKernel(float* alpha, const T* x, const T* w, int nkv, int c) {
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const T* xr = x + r * c;
  for (int j = warp; j < nkv; j += warps) {
    const T* wj = w + static_cast<int64_t>(j) * c;
    float z = 0.0f;
    for (int e = lane; e < c; e += 32) z += ToF(xr[e]) * ToF(wj[e]);
    z = WarpSum(z);
    if (lane == 0) alpha[r * nkv + j] = z > 0.0f ? z : 0.0f;
  }
}

template <typename T>
__global__ void MixKernel(T* vmix, const float* alpha, const T* v, const T* v1, int hs,
                          int64_t count) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    vmix[k] = FromF<T>(ToF(v[k]) + alpha[k / hs] * ToF(v1[k]));
  }
}

template <typename T>
__global__ void MixBackwardKernel(T* dv, T* dv1, float* dalpha, const T* dvmix, const T* v1,
                                  const float* alpha, int nkv, int hs) {
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int j = warp; j < nkv; j += warps) {
    const int64_t o = (r * nkv + j) * hs;
    const float a = alpha[r * nkv + j];
    float dot = 0.0f;
    for (int e = lane; e < hs; e += 32) {
      const float g = ToF(dvmix[o + e]);
      dot += ToF(v1[o + e]) * g;
      dv[o + e] = dvmix[o + e];
      dv1[o + e] = FromF<T>(ToF(dv1[o + e]) + a * g);
    }
    dot = WarpSum(dot);
    if (lane == 0) dalpha[r * nkv + j] = a > 0.0f ? dot : 0.0f;  // ReLU: a closed gate
  }
}

// dx[r, :] += dalpha[r, :] W, one block per token.
template <typename T>
__global__ void GateBackwardInputKernel(T* dx, const float* dalpha, const T* w, int nkv, int c) {
  const int64_t r = blockIdx.x;
  T* dxr = dx + r * c;
  for (int e = threadIdx.x; e < c; e += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < nkv; ++j) acc += dalpha[r * nkv + j] * ToF(w[static_cast<int64_t>(j) * c + e]);
    dxr[e] = FromF<T>(ToF(dxr[e]) + acc);
  }
}

// dw[j, e] += sum_r dalpha[r, j] x[r, e]: block (kTileCols, kTileRows) for columns
// blockIdx.x * kTileCols.. of gate j = blockIdx.y; the row lanes are added in order.
template <typename T>
__global__ void GateBackwardWeightKernel(float* dw, const float* dalpha, const T* x, int n,
                                         int nkv, int c) {
  __shared__ float part[kTileRows][kTileCols + 1];
  const int e = blockIdx.x * kTileCols + threadIdx.x;
  const int j = blockIdx.y;
  float acc = 0.0f;
  if (e < c) {
    for (int64_t r = threadIdx.y; r < n; r += kTileRows) acc += dalpha[r * nkv + j] * ToF(x[r * c + e]);
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && e < c) {
    float sum = 0.0f;
    for (int k = 0; k < kTileRows; ++k) sum += part[k][threadIdx.x];
    dw[static_cast<int64_t>(j) * c + e] += sum;
  }
}

}  // namespace

template <typename T>
absl::Status ValueGateForward(const core::CudaExec& exec, float* alpha, const T* x, const T* w,
                              int n, int nkv, int c) {
  cudaStream_t stream = exec.stream;
  if (n <= 0 || nkv <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ValueGateKernel", GateKernel<T>, dim3(n),
                                     dim3(RowThreads(nkv, 0)), 0, stream, alpha, x, w, nkv, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status ValueMixForward(const core::CudaExec& exec, T* vmix, const float* alpha, const T* v,
                             const T* v1, int n, int nkv, int hs) {
  cudaStream_t stream = exec.stream;
  const int64_t count = static_cast<int64_t>(n) * nkv * hs;
  if (count <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ValueMixKernel", MixKernel<T>,
                                     dim3(GridBlocks(count, kThreads)), dim3(kThreads), 0, stream,
                                     vmix, alpha, v, v1, hs, count));
  return absl::OkStatus();
}

template <typename T>
absl::Status ValueMixBackward(const core::CudaExec& exec, T* dv, T* dv1, float* dalpha,
                              const T* dvmix, const T* v1, const float* alpha, int n, int nkv,
                              int hs) {
  cudaStream_t stream = exec.stream;
  if (n <= 0 || nkv <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ValueMixBackwardKernel", MixBackwardKernel<T>, dim3(n),
                                     dim3(RowThreads(nkv, 0)), 0, stream, dv, dv1, dalpha, dvmix,
                                     v1, alpha, nkv, hs));
  return absl::OkStatus();
}

template <typename T>
absl::Status ValueGateBackward(const core::CudaExec& exec, T* dx, float* dw, const float* dalpha,
                               const T* x, const T* w, int n, int nkv, int c) {
  cudaStream_t stream = exec.stream;
  if (n <= 0 || nkv <= 0 || c <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ValueGateBackwardInputKernel", GateBackwardInputKernel<T>,
                                     dim3(n), dim3(RowThreads(1, c)), 0, stream, dx, dalpha, w,
                                     nkv, c));
  if (dw == nullptr) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>((c + kTileCols - 1) / kTileCols), nkv);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ValueGateBackwardWeightKernel",
                                     GateBackwardWeightKernel<T>, grid,
                                     dim3(kTileCols, kTileRows), 0, stream, dw, dalpha, x, n, nkv,
                                     c));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template absl::Status ValueGateForward<T>(const core::CudaExec&, float*, const T*, const T*, \
                                            int, int, int);                                    \
  template absl::Status ValueMixForward<T>(const core::CudaExec&, T*, const float*, const T*,  \
                                           const T*, int, int, int);                           \
  template absl::Status ValueMixBackward<T>(const core::CudaExec&, T*, T*, float*, const T*,   \
                                            const T*, const float*, int, int, int);            \
  template absl::Status ValueGateBackward<T>(const core::CudaExec&, T*, float*, const float*,  \
                                             const T*, const T*, int, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
