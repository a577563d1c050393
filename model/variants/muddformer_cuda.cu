// CUDA kernels of MUDDFormer's dense connection (muddformer_cuda.h).
#include "model/variants/muddformer_cuda.h"

#include "core/cuda/bf16.cuh"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;
constexpr int kW = kMaxMuddWays;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

template <typename T>
__global__ void GeluKernel(T* g, const T* h, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = Ld(h + i);
    St(g + i, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(T* dh, const T* dg, const T* h, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = Ld(h + i);
    const float d = 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
                    x * expf(-0.5f * x * x) * 0.39894228040143268f;  // 1 / sqrt(2 pi)
    St(dh + i, Ld(dg + i) * d);
  }
}

template <typename T>
__global__ void CombineKernel(T* const* outs, int ways, const T* const* xs, int sources,
                              const float* a, int ld, const float* stat, int64_t rows, int c) {
  const int64_t total = rows * c * ways;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int w = static_cast<int>(i / (rows * c));
    const int64_t re = i % (rows * c), r = re / c;
    const float* ar = a + r * ld + w * sources;
    float s = 0.0f;
    for (int j = 0; j < sources; ++j) s += (ar[j] + stat[w * sources + j]) * Ld(xs[j] + re);
    St(outs[w] + re, s);
  }
}

template <typename T>
__global__ void CombineDxKernel(T* const* dxs, const T* const* douts, int ways, int sources,
                                const float* a, int ld, const float* stat, int64_t rows, int c) {
  const int64_t total = rows * c * sources;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i / (rows * c));
    const int64_t re = i % (rows * c), r = re / c;
    float s = Ld(dxs[j] + re);
    for (int w = 0; w < ways; ++w) {
      s += (a[r * ld + w * sources + j] + stat[w * sources + j]) * Ld(douts[w] + re);
    }
    St(dxs[j] + re, s);
  }
}

// Block (token r, source j): <X_j, douts[w]> for every way; block j == 0 zeroes the padding.
template <typename T>
__global__ void CombineDotsKernel(float* da, T* da_t, const T* const* douts, int ways,
                                  const T* const* xs, int sources, int ld, int c) {
  const int64_t r = blockIdx.x;
  const int j = blockIdx.y;
  float acc[kW] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int e = threadIdx.x; e < c; e += blockDim.x) {
    const float x = Ld(xs[j] + r * c + e);
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      if (w < ways) acc[w] += x * Ld(douts[w] + r * c + e);
    }
  }
  BlockSums<kThreads, kW>(acc);
  if (threadIdx.x == 0) {
    for (int w = 0; w < ways; ++w) {
      da[r * ld + w * sources + j] = acc[w];
      St(da_t + r * ld + w * sources + j, acc[w]);
    }
  }
  if (j == 0) {
    for (int k = ways * sources + threadIdx.x; k < ld; k += blockDim.x) {
      da[r * ld + k] = 0.0f;
      St(da_t + r * ld + k, 0.0f);
    }
  }
}

}  // namespace

template <typename T>
cudaError_t GeluForward(T* g, const T* h, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Launch("GeluKernel", GeluKernel<T>, dim3(Blocks(n)), dim3(kThreads), 0, stream, g, h, n);
}

template <typename T>
cudaError_t GeluBackward(T* dh, const T* dg, const T* h, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Launch("GeluBackwardKernel", GeluBackwardKernel<T>, dim3(Blocks(n)), dim3(kThreads), 0,
                stream, dh, dg, h, n);
}

template <typename T>
cudaError_t DenseCombineForward(T* const* outs, int ways, const T* const* xs, int sources,
                                const float* a, int ld, const float* stat, int rows, int c,
                                cudaStream_t stream) {
  if (ways < 1 || ways > kMaxMuddWays || ld < ways * sources) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return Launch("CombineKernel", CombineKernel<T>,
                dim3(Blocks(static_cast<int64_t>(rows) * c * ways)), dim3(kThreads), 0, stream,
                outs, ways, xs, sources, a, ld, stat, rows, c);
}

template <typename T>
cudaError_t DenseCombineBackward(float* da, T* da_t, T* const* dxs, const T* const* douts,
                                 int ways, const T* const* xs, int sources, const float* a,
                                 int ld, const float* stat, int rows, int c, cudaStream_t stream) {
  if (ways < 1 || ways > kMaxMuddWays || ld < ways * sources) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  // The dots read xs before the dx kernel, whose lists may hold other buffers only.
  if (cudaError_t e = Launch("CombineDotsKernel", CombineDotsKernel<T>, dim3(rows, sources),
                             dim3(kThreads), 0, stream, da, da_t, douts, ways, xs, sources, ld,
                             c);
      e != cudaSuccess) {
    return e;
  }
  return Launch("CombineDxKernel", CombineDxKernel<T>,
                dim3(Blocks(static_cast<int64_t>(rows) * c * sources)), dim3(kThreads), 0, stream,
                dxs, douts, ways, sources, a, ld, stat, rows, c);
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template cudaError_t GeluForward<T>(T*, const T*, int64_t, cudaStream_t);                    \
  template cudaError_t GeluBackward<T>(T*, const T*, const T*, int64_t, cudaStream_t);         \
  template cudaError_t DenseCombineForward<T>(T* const*, int, const T* const*, int,            \
                                              const float*, int, const float*, int, int,       \
                                              cudaStream_t);                                   \
  template cudaError_t DenseCombineBackward<T>(float*, T*, T* const*, const T* const*, int,    \
                                               const T* const*, int, const float*, int,        \
                                               const float*, int, int, cudaStream_t);

SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
