// DAR's mix and write on the GPU (dar_ops.h; dar_ops_cpu.cc is the reference). Reductions:
// the grid of core::cuda::ReduceBlocks(n) blocks, each thread a fixed grid-stride slice, a
// shared-memory tree per block, then one thread adds the block sums in block order.
#include "core/cuda/bf16.cuh"
#include "core/check.h"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/reduce_grid.h"
#include "model/variants/dar_ops.h"
#include "core/cuda/workspace.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: ToF, Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ void Softmax2(const float* a, float* c0, float* c1) {
  const float m = fmaxf(a[0], a[1]);
  const float e0 = expf(a[0] - m), e1 = expf(a[1] - m);
  *c0 = e0 / (e0 + e1);
  *c1 = e1 / (e0 + e1);
}

template <typename T>
__global__ void MixForwardKernel(T* u, const T* r0, const T* r1, const float* mix, int64_t n) {
  float c0, c1;
  Softmax2(mix, &c0, &c1);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(u + i, c0 * Ld(r0 + i) + c1 * Ld(r1 + i));
  }
}

template <typename T>
__global__ void MixBackwardKernel(T* dr0, T* dr1, const T* du, const T* r0, const T* r1,
                                  const float* mix, float* scratch, int64_t n) {
  float c0, c1;
  Softmax2(mix, &c0, &c1);
  float acc[2] = {0.0f, 0.0f};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = Ld(du + i);
    acc[0] += Ld(r0 + i) * g;
    acc[1] += Ld(r1 + i) * g;
    St(dr0 + i, c0 * g);
    St(dr1 + i, c1 * g);
  }
  BlockSums<kThreads, 2>(acc);
  if (threadIdx.x == 0) {
    scratch[blockIdx.x * 2] = acc[0];
    scratch[blockIdx.x * 2 + 1] = acc[1];
  }
}

__global__ void MixFinishKernel(const float* scratch, int blocks, const float* mix,
                                float* grad_mix) {
  if (threadIdx.x != 0) return;
  double dc[2] = {0.0, 0.0};
  for (int b = 0; b < blocks; ++b) {
    dc[0] += scratch[b * 2];
    dc[1] += scratch[b * 2 + 1];
  }
  float c[2];
  Softmax2(mix, &c[0], &c[1]);
  const double dot = c[0] * dc[0] + c[1] * dc[1];
  grad_mix[0] += static_cast<float>(c[0] * (dc[0] - dot));
  grad_mix[1] += static_cast<float>(c[1] * (dc[1] - dot));
}

template <typename T>
__global__ void WriteForwardKernel(T* q0, T* q1, const T* p0, const T* p1, const T* y,
                                   const float* transport, const float* write, int64_t n) {
  const float rho = Sigmoid(transport[0]);
  const float b0 = 2.0f * Sigmoid(write[0]), b1 = 2.0f * Sigmoid(write[1]);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = p0 == nullptr ? 0.0f : Ld(p0 + i);
    const float b = p1 == nullptr ? 0.0f : Ld(p1 + i);
    const float yv = Ld(y + i);
    St(q0 + i, rho * a + (1.0f - rho) * b + b0 * yv);
    St(q1 + i, (1.0f - rho) * a + rho * b + b1 * yv);
  }
}

template <typename T>
__global__ void WriteBackwardKernel(T* dy, T* dp0, T* dp1, const T* g0s, const T* g1s, const T* y,
                                    const T* p0, const T* p1, const float* transport,
                                    const float* write, float* scratch, int64_t n) {
  const float rho = Sigmoid(transport[0]);
  const float b0 = 2.0f * Sigmoid(write[0]), b1 = 2.0f * Sigmoid(write[1]);
  const bool has_p = p0 != nullptr;
  float acc[3] = {0.0f, 0.0f, 0.0f};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g0 = Ld(g0s + i), g1 = Ld(g1s + i), yv = Ld(y + i);
    St(dy + i, b0 * g0 + b1 * g1);
    acc[0] += yv * g0;
    acc[1] += yv * g1;
    if (has_p) {
      acc[2] += (Ld(p0 + i) - Ld(p1 + i)) * (g0 - g1);
      St(dp0 + i, rho * g0 + (1.0f - rho) * g1);
      St(dp1 + i, (1.0f - rho) * g0 + rho * g1);
    } else {
      St(dp0 + i, 0.0f);
      St(dp1 + i, 0.0f);
    }
  }
  BlockSums<kThreads, 3>(acc);
  if (threadIdx.x == 0) {
    for (int j = 0; j < 3; ++j) scratch[blockIdx.x * 3 + j] = acc[j];
  }
}

__global__ void WriteFinishKernel(const float* scratch, int blocks, const float* transport,
                                  const float* write, float* grad_transport, float* grad_write) {
  if (threadIdx.x != 0) return;
  double s[3] = {0.0, 0.0, 0.0};
  for (int b = 0; b < blocks; ++b) {
    for (int j = 0; j < 3; ++j) s[j] += scratch[b * 3 + j];
  }
  const double rho = 1.0 / (1.0 + exp(-static_cast<double>(transport[0])));
  const double sw0 = 1.0 / (1.0 + exp(-static_cast<double>(write[0])));
  const double sw1 = 1.0 / (1.0 + exp(-static_cast<double>(write[1])));
  grad_write[0] += static_cast<float>(s[0] * 2 * sw0 * (1 - sw0));
  grad_write[1] += static_cast<float>(s[1] * 2 * sw1 * (1 - sw1));
  grad_transport[0] += static_cast<float>(s[2] * rho * (1 - rho));
}

}  // namespace

template <typename T>
absl::Status DarMixForward(const core::CudaExec& x, T* u, const T* r0, const T* r1,
                           const float* mix, int64_t n) {
  cudaStream_t stream = x.stream;
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MixForwardKernel", MixForwardKernel<T>, dim3(Blocks(n)),
                                     dim3(kThreads), 0, stream, u, r0, r1, mix, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status DarMixBackward(const core::CudaExec& x, T* dr0, T* dr1, const T* du, const T* r0,
                            const T* r1, const float* mix, float* grad_mix, int64_t n) {
  cudaStream_t stream = x.stream;
  const int blocks = core::cuda::ReduceBlocks(n, kThreads);
  SATDAR_ASSIGN_OR_RETURN(float* scratch, core::cuda::Scratch<float>(x, 2 * blocks, "DarMixBackward"));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MixBackwardKernel", MixBackwardKernel<T>, dim3(blocks),
                                     dim3(kThreads), 0, stream, dr0, dr1, du, r0, r1, mix,
                                     scratch, n));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MixFinishKernel", MixFinishKernel, dim3(1), dim3(32), 0,
                                     stream, scratch, blocks, mix, grad_mix));
  return absl::OkStatus();
}

template <typename T>
absl::Status DarWriteForward(const core::CudaExec& x, T* q0, T* q1, const T* p0, const T* p1,
                             const T* y, const float* transport, const float* write, int64_t n) {
  cudaStream_t stream = x.stream;
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("WriteForwardKernel", WriteForwardKernel<T>,
                                     dim3(Blocks(n)), dim3(kThreads), 0, stream, q0, q1, p0, p1,
                                     y, transport, write, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status DarWriteBackward(const core::CudaExec& x, T* dy, T* dp0, T* dp1, const T* g0,
                              const T* g1, const T* y, const T* p0, const T* p1,
                              const float* transport, const float* write, float* grad_transport,
                              float* grad_write, int64_t n) {
  cudaStream_t stream = x.stream;
  const int blocks = core::cuda::ReduceBlocks(n, kThreads);
  SATDAR_ASSIGN_OR_RETURN(float* scratch, core::cuda::Scratch<float>(x, 3 * blocks, "DarWriteBackward"));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("WriteBackwardKernel", WriteBackwardKernel<T>, dim3(blocks),
                                     dim3(kThreads), 0, stream, dy, dp0, dp1, g0, g1, y, p0, p1,
                                     transport, write, scratch, n));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("WriteFinishKernel", WriteFinishKernel, dim3(1), dim3(32), 0,
                                     stream, scratch, blocks, transport, write, grad_transport,
                                     grad_write));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template absl::Status DarMixForward<T>(const core::CudaExec&, T*, const T*, const T*,        \
                                         const float*, int64_t);                               \
  template absl::Status DarMixBackward<T>(const core::CudaExec&, T*, T*, const T*, const T*,   \
                                          const T*, const float*, float*, int64_t);            \
  template absl::Status DarWriteForward<T>(const core::CudaExec&, T*, T*, const T*, const T*,  \
                                           const T*, const float*, const float*, int64_t);     \
  template absl::Status DarWriteBackward<T>(const core::CudaExec&, T*, T*, T*, const T*,       \
                                            const T*, const T*, const T*, const T*,            \
                                            const float*, const float*, float*, float*,        \
                                            int64_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
