// The GPU model's small kernels (train_kernels.h). Reductions: a grid of ReduceBlocks(n)
// blocks, each thread a fixed grid-stride slice, a shared-memory tree per block, then one
// thread per quantity adds the block sums in block order.
#include "model/gpu/train_kernels.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/workspace.h"

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
absl::Status CastFromF32(const CudaExec& x, T* out, const float* in, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("CastKernel", CastKernel<T>, dim3(Blocks(n)), dim3(kThreads),
                                     0, x.stream, out, in, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status Add(const CudaExec& x, T* out, const T* a, const T* b, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("AddKernel", AddKernel<T>, dim3(Blocks(n)), dim3(kThreads), 0,
                                     x.stream, out, a, b, n));
  return absl::OkStatus();
}

absl::Status AccumulateLoss(const CudaExec& x, double* acc, const float* losses, int n,
                            double scale) {
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("LossKernel", LossKernel, dim3(1), dim3(kThreads), 0,
                                     x.stream, acc, losses, n, scale));
  return absl::OkStatus();
}

absl::Status SumSquares(const CudaExec& x, double* out, const float* v, int64_t n) {
  const int blocks = ::satdar::core::cuda::ReduceBlocks(n, kThreads);
  absl::StatusOr<double*> scratch =
      ::satdar::core::cuda::Scratch<double>(x, static_cast<size_t>(blocks), "SumSquares");
  if (!scratch.ok()) return scratch.status();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SumSquaresKernel", SumSquaresKernel, dim3(blocks),
                                     dim3(kThreads), 0, x.stream, *scratch, v, n));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SumFinishKernel", SumFinishKernel, dim3(1), dim3(32), 0,
                                     x.stream, out, *scratch, blocks));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template absl::Status CastFromF32<T>(const CudaExec&, T*, const float*, int64_t);            \
  template absl::Status Add<T>(const CudaExec&, T*, const T*, const T*, int64_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::gpu
