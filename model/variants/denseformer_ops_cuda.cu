// DenseFormer's depth-weighted average on the GPU (denseformer_ops.h; denseformer_ops_cpu.cc
// is the reference). Reductions: the grid of core::cuda::ReduceBlocks(n) blocks per source,
// then one thread per source adds the block sums in block order.
#include "core/cuda/bf16.cuh"
#include "core/check.h"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/reduce_grid.h"
#include "model/variants/denseformer_ops.h"
#include "core/cuda/workspace.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: ToF, Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

template <typename T>
__global__ void DwaForwardKernel(T* out, const T* const* xs, int count, const float* a,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < count; ++j) acc += a[j] * Ld(xs[j] + i);
    St(out + i, acc);
  }
}

// Block (b, j): dxs[j] += a_j dy over its slice; its share of <xs[j], dy> to scratch.
template <typename T>
__global__ void DwaBackwardKernel(T* const* dxs, const T* dy, const T* const* xs, const float* a,
                                  float* scratch, int64_t n) {
  const int j = blockIdx.y;
  const float aj = a[j];
  const T* x = xs[j];
  T* dx = dxs[j];
  float acc[1] = {0.0f};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = Ld(dy + i);
    acc[0] += Ld(x + i) * g;
    St(dx + i, Ld(dx + i) + aj * g);
  }
  BlockSums<kThreads, 1>(acc);
  if (threadIdx.x == 0) scratch[static_cast<int64_t>(j) * core::cuda::kReduceBlocks + blockIdx.x] = acc[0];
}

__global__ void DwaFinishKernel(const float* scratch, int blocks, int count, float* grad_a) {
  const int j = threadIdx.x;
  if (j >= count) return;
  double s = 0.0;
  for (int b = 0; b < blocks; ++b) s += scratch[static_cast<int64_t>(j) * core::cuda::kReduceBlocks + b];
  grad_a[j] += static_cast<float>(s);
}

}  // namespace

template <typename T>
absl::Status DwaForward(const core::CudaExec& x, T* out, const T* const* xs, int count,
                        const float* a, int64_t n) {
  cudaStream_t stream = x.stream;
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DwaForwardKernel", DwaForwardKernel<T>, dim3(Blocks(n)),
                                     dim3(kThreads), 0, stream, out, xs, count, a, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status DwaBackward(const core::CudaExec& x, T* const* dxs, float* grad_a, const T* dy,
                         const T* const* xs, int count, const float* a, int64_t n) {
  cudaStream_t stream = x.stream;
  if (count == 0) return absl::OkStatus();
  SATDAR_ASSIGN_OR_RETURN(
      float* scratch,
      core::cuda::Scratch<float>(x, static_cast<size_t>(count) * core::cuda::kReduceBlocks, "DwaBackward"));
  const int blocks = core::cuda::ReduceBlocks(n, kThreads);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DwaBackwardKernel", DwaBackwardKernel<T>,
                                     dim3(blocks, count), dim3(kThreads), 0, stream, dxs, dy, xs,
                                     a, scratch, n));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DwaFinishKernel", DwaFinishKernel, dim3(1),
                                     dim3(((count + 31) / 32) * 32), 0, stream, scratch, blocks,
                                     count, grad_a));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template absl::Status DwaForward<T>(const core::CudaExec&, T*, const T* const*, int,         \
                                      const float*, int64_t);                                  \
  template absl::Status DwaBackward<T>(const core::CudaExec&, T* const*, float*, const T*,     \
                                       const T* const*, int, const float*, int64_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
