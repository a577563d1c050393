// CUDA RMSNorm (see rmsnorm.h and rmsnorm_cpu.cc for the math): one block per row for the
// forward and the input gradient, and a column-tiled kernel for the weight gradient that sums
// the rows in a fixed order (deterministic, no atomics). fp32 arithmetic for every T.
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
constexpr int kRowThreads = 256;  // most threads per row block (a multiple of 32)
constexpr int kTileCols = 32;     // weight gradient: columns per block
constexpr int kTileRows = 8;      // weight gradient: row lanes per block

using namespace ::satdar::core::cuda::device;  // ToF, FromF, Ld, St, WarpSum (bf16.cuh)

// Sum over the block (blockDim.x a multiple of 32); every thread gets the total. The order of
// additions depends only on the block size, so the result is reproducible.
__device__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  v = WarpSum(v);
  return v;
}

template <typename T>
__global__ void RmsNormForwardKernel(T* out, float* rstd, const T* inp, const T* weight, int c,
                                     float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = inp + row * c;
  T* y = out + row * c;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < c; i += blockDim.x) {
    const float xi = ToF(x[i]);
    ss += xi * xi;
  }
  ss = BlockSum(ss, scratch);
  const float s = 1.0f / sqrtf(ss / c + eps);
  if (threadIdx.x == 0) rstd[row] = s;
  // Each thread rereads and rewrites only its own elements, so out may alias inp.
  for (int i = threadIdx.x; i < c; i += blockDim.x) y[i] = FromF<T>(ToF(weight[i]) * (ToF(x[i]) * s));
}

template <typename T>
__global__ void RmsNormBackwardInputKernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                           const float* rstd, int c) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = inp + row * c;
  const T* dy = dout + row * c;
  T* dx = dinp + row * c;
  const float s = rstd[row];
  float dot = 0.0f;  // sum_j g_j dy_j x_j
  for (int i = threadIdx.x; i < c; i += blockDim.x) dot += ToF(weight[i]) * ToF(dy[i]) * ToF(x[i]);
  dot = BlockSum(dot, scratch);
  const float coef = dot * s * s * s / c;
  for (int i = threadIdx.x; i < c; i += blockDim.x) {
    dx[i] = FromF<T>(ToF(dx[i]) + ToF(weight[i]) * ToF(dy[i]) * s - coef * ToF(x[i]));
  }
}

// dweight[e] += sum_r dy[r,e] x[r,e] rstd[r]: block (kTileCols, kTileRows) owns kTileCols
// columns; row lane ty sums rows ty, ty + kTileRows, ...; the lanes are added in order.
template <typename T>
__global__ void RmsNormBackwardWeightKernel(float* dweight, const T* dout, const T* inp,
                                            const float* rstd, int n, int c) {
  __shared__ float part[kTileRows][kTileCols + 1];
  const int e = blockIdx.x * kTileCols + threadIdx.x;
  float acc = 0.0f;
  if (e < c) {
    for (int64_t r = threadIdx.y; r < n; r += kTileRows) {
      acc += ToF(dout[r * c + e]) * ToF(inp[r * c + e]) * rstd[r];
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && e < c) {
    float sum = 0.0f;
    for (int k = 0; k < kTileRows; ++k) sum += part[k][threadIdx.x];
    dweight[e] += sum;
  }
}
// Threads per row block: enough warps for the row, at most kRowThreads. A 16-wide QK-norm row
// gets one warp instead of eight idle ones.
unsigned RowThreads(int c) {
  const int warps = (c + 31) / 32;
  return static_cast<unsigned>(warps * 32 < kRowThreads ? warps * 32 : kRowThreads);
}
}  // namespace

template <typename T>
absl::Status RmsNormForward(const CudaExec& x, T* out, float* rstd, const T* inp, const T* weight,
                            int n, int c, float eps) {
  if (n <= 0 || c <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RmsNormForwardKernel", RmsNormForwardKernel<T>, dim3(n),
                                     dim3(RowThreads(c)), 0, x.stream, out, rstd, inp, weight, c,
                                     eps));
  return absl::OkStatus();
}

template <typename T>
absl::Status RmsNormBackward(const CudaExec& x, T* dinp, float* dweight, const T* dout,
                             const T* inp, const T* weight, const float* rstd, int n, int c) {
  if (n <= 0 || c <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RmsNormBackwardInputKernel", RmsNormBackwardInputKernel<T>,
                                     dim3(n), dim3(RowThreads(c)), 0, x.stream, dinp, dout, inp,
                                     weight, rstd, c));
  if (dweight == nullptr) return absl::OkStatus();
  const dim3 block(kTileCols, kTileRows);
  const unsigned tiles = static_cast<unsigned>((c + kTileCols - 1) / kTileCols);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RmsNormBackwardWeightKernel", RmsNormBackwardWeightKernel<T>,
                                     dim3(tiles), block, 0, x.stream, dweight, dout, inp, rstd, n,
                                     c));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template absl::Status RmsNormForward<T>(const CudaExec&, T*, float*, const T*, const T*, int,    \
                                          int, float);                                             \
  template absl::Status RmsNormBackward<T>(const CudaExec&, T*, float*, const T*, const T*,        \
                                           const T*, const float*, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
