// The GPU model's small kernels (train_kernels.h). Reductions: a grid of ReduceBlocks(n)
// blocks, each thread a fixed grid-stride slice, a shared-memory tree per block, then one
// thread per quantity adds the block sums in block order.
#include "model/gpu/train_kernels.h"

#include "core/cuda/bf16.cuh"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"

namespace satdar::model::gpu {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: ToF, Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

template <typename T>
__global__ void CastKernel(T* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(out + i, in[i]);
  }
}

template <typename T>
__global__ void AddKernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(out + i, Ld(a + i) + Ld(b + i));
  }
}


__global__ void LossKernel(double* acc, const float* losses, int n, double scale) {
  double v[1] = {0.0};
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[0] += losses[i];
  BlockSums<kThreads, 1>(v);
  if (threadIdx.x == 0) *acc += scale * v[0];
}

__global__ void SumSquaresKernel(double* scratch, const float* x, int64_t n) {
  double v[1] = {0.0};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double e = x[i];
    v[0] += e * e;
  }
  BlockSums<kThreads, 1>(v);
  if (threadIdx.x == 0) scratch[blockIdx.x] = v[0];
}

__global__ void SumFinishKernel(double* out, const double* scratch, int blocks) {
  if (threadIdx.x != 0) return;
  double s = 0.0;
  for (int b = 0; b < blocks; ++b) s += scratch[b];
  *out = s;
}

}  // namespace

template <typename T>
cudaError_t CastFromF32(T* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Launch("CastKernel", CastKernel<T>, dim3(Blocks(n)), dim3(kThreads), 0, stream, out, in,
                n);
}

template <typename T>
cudaError_t Add(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Launch("AddKernel", AddKernel<T>, dim3(Blocks(n)), dim3(kThreads), 0, stream, out, a, b,
                n);
}

cudaError_t AccumulateLoss(double* acc, const float* losses, int n, double scale,
                           cudaStream_t stream) {
  return Launch("LossKernel", LossKernel, dim3(1), dim3(kThreads), 0, stream, acc, losses, n,
                scale);
}

cudaError_t SumSquares(double* out, const float* x, int64_t n, double* scratch,
                       cudaStream_t stream) {
  const int blocks = ::satdar::core::cuda::ReduceBlocks(n, kThreads);
  if (cudaError_t e = Launch("SumSquaresKernel", SumSquaresKernel, dim3(blocks), dim3(kThreads),
                             0, stream, scratch, x, n);
      e != cudaSuccess) {
    return e;
  }
  return Launch("SumFinishKernel", SumFinishKernel, dim3(1), dim3(32), 0, stream, out, scratch,
                blocks);
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template cudaError_t CastFromF32<T>(T*, const float*, int64_t, cudaStream_t);                \
  template cudaError_t Add<T>(T*, const T*, const T*, int64_t, cudaStream_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::gpu
