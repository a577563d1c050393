// CUDA value gate and mix of SATFormer (see value_gate_cuda.h). One block per token: its
// warps compute the token's NKV gates (a lane-strided dot product each, reduced by shuffles in
// a fixed order), then all threads mix V and V1. The backward does the same per token (gate
// gradients, dv, dv1, dx) and sums dW_alpha over the tokens in a column-tiled second kernel
// with a fixed order.
#include "model/layers/value_gate_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/bf16.cuh"
#include "core/cuda/launch.h"

namespace satdar::model::cuda {

namespace {
constexpr int kRowThreads = 256;  // the most threads per row block (a multiple of 32)
constexpr int kTileCols = 32;
constexpr int kTileRows = 8;

using namespace ::satdar::core::cuda::device;  // ToF, FromF, Ld, St, WarpSum (bf16.cuh)
using ::satdar::core::cuda::Launch;

// Dynamic shared memory: nkv floats (the token's gates).
template <typename T>
__global__ void ForwardKernel(T* vmix, float* alpha, const T* x, const T* w, const T* v,
                              const T* v1, int nkv, int hs, int c) {
  SATDAR_DYNAMIC_SHARED(float, gate);
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const T* xr = x + r * c;
  for (int j = warp; j < nkv; j += warps) {
    const T* wj = w + static_cast<int64_t>(j) * c;
    float z = 0.0f;
    for (int e = lane; e < c; e += 32) z += ToF(xr[e]) * ToF(wj[e]);
    z = WarpSum(z);
    if (lane == 0) {
      const float a = z > 0.0f ? z : 0.0f;
      gate[j] = a;
      alpha[r * nkv + j] = a;
    }
  }
  __syncthreads();
  const int width = nkv * hs;
  const int64_t base = r * width;
  for (int k = threadIdx.x; k < width; k += blockDim.x) {
    vmix[base + k] = FromF<T>(ToF(v[base + k]) + gate[k / hs] * ToF(v1[base + k]));
  }
}

// Dynamic shared memory: nkv floats (the token's gate gradients).
template <typename T>
__global__ void BackwardRowKernel(T* dx, T* dv, T* dv1, float* dalpha, const T* dvmix,
                                  const T* w, const T* v1, const float* alpha, int nkv, int hs,
                                  int c) {
  SATDAR_DYNAMIC_SHARED(float, dgate);
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t base = r * nkv * hs;
  for (int j = warp; j < nkv; j += warps) {
    const int64_t o = base + static_cast<int64_t>(j) * hs;
    const float a = alpha[r * nkv + j];
    float dot = 0.0f;
    for (int e = lane; e < hs; e += 32) {
      const float g = ToF(dvmix[o + e]);
      dot += ToF(v1[o + e]) * g;
      dv[o + e] = dvmix[o + e];
      dv1[o + e] = FromF<T>(ToF(dv1[o + e]) + a * g);
    }
    dot = WarpSum(dot);
    if (lane == 0) {
      const float da = a > 0.0f ? dot : 0.0f;  // ReLU: no gradient through a closed gate
      dgate[j] = da;
      dalpha[r * nkv + j] = da;
    }
  }
  __syncthreads();
  T* dxr = dx + r * c;
  for (int e = threadIdx.x; e < c; e += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < nkv; ++j) acc += dgate[j] * ToF(w[static_cast<int64_t>(j) * c + e]);
    dxr[e] = FromF<T>(ToF(dxr[e]) + acc);
  }
}

// dw[j, e] += sum_r dalpha[r, j] x[r, e]: block (kTileCols, kTileRows) for columns
// blockIdx.x * kTileCols.. of gate j = blockIdx.y; the row lanes are added in order.
template <typename T>
__global__ void BackwardWeightKernel(float* dw, const float* dalpha, const T* x, int n, int nkv,
                                     int c) {
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

// Threads per row block: a warp per gate and a thread per element of the widest loop (the
// token's C inputs or its NKV x HS values), at most kRowThreads. The results do not depend on
// it: each gate's sum runs over its warp's lanes in a fixed pattern, and each element is one
// thread's.
unsigned RowThreads(int nkv, int hs, int c) {
  const int width = nkv * hs > c ? nkv * hs : c;
  const int warps = nkv > (width + 31) / 32 ? nkv : (width + 31) / 32;
  return static_cast<unsigned>(warps * 32 < kRowThreads ? warps * 32 : kRowThreads);
}
}  // namespace

template <typename T>
cudaError_t ValueGateForward(T* vmix, float* alpha, const T* x, const T* w, const T* v,
                             const T* v1, int n, int nkv, int hs, int c, cudaStream_t stream) {
  if (n <= 0 || nkv <= 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(nkv) * sizeof(float);
  return Launch("ValueGateForwardKernel", ForwardKernel<T>, dim3(n), dim3(RowThreads(nkv, hs, c)),
                smem, stream, vmix, alpha, x, w, v, v1, nkv, hs, c);
}

template <typename T>
cudaError_t ValueGateBackward(T* dx, float* dw, T* dv, T* dv1, float* dalpha, const T* dvmix,
                              const T* x, const T* w, const T* v1, const float* alpha, int n,
                              int nkv, int hs, int c, cudaStream_t stream) {
  if (n <= 0 || nkv <= 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(nkv) * sizeof(float);
  const cudaError_t err =
      Launch("ValueGateBackwardRowKernel", BackwardRowKernel<T>, dim3(n),
             dim3(RowThreads(nkv, hs, c)), smem, stream, dx, dv, dv1, dalpha, dvmix, w, v1, alpha,
             nkv, hs, c);
  if (err != cudaSuccess || dw == nullptr || c <= 0) return err;
  const dim3 grid(static_cast<unsigned>((c + kTileCols - 1) / kTileCols), nkv);
  return Launch("ValueGateBackwardWeightKernel", BackwardWeightKernel<T>, grid,
                dim3(kTileCols, kTileRows), 0, stream, dw, dalpha, x, n, nkv, c);
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template cudaError_t ValueGateForward<T>(T*, float*, const T*, const T*, const T*, const T*, \
                                           int, int, int, int, cudaStream_t);                  \
  template cudaError_t ValueGateBackward<T>(T*, float*, T*, T*, float*, const T*, const T*,     \
                                            const T*, const T*, const float*, int, int, int,   \
                                            int, cudaStream_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
