// CUDA side of core/ops/elementwise.h: grid-stride kernels in fp32, copies and fills as
// asynchronous memory operations on the stream.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "core/ops/elementwise.h"

namespace satdar::core::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, GridBlocks

constexpr int kThreads = 256;

template <typename T>
__global__ void AddKernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(out + i, Ld(a + i) + Ld(b + i));
  }
}

template <typename T>
__global__ void AddToKernel(T* out, const T* a, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(out + i, Ld(out + i) + Ld(a + i));
  }
}

}  // namespace

template <typename T>
absl::Status Copy(const CudaExec& x, T* dst, const T* src, int64_t n) {
  if (n == 0 || dst == src) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(T),
                                              cudaMemcpyDeviceToDevice, x.stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status Zero(const CudaExec& x, T* dst, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(T), x.stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status Add(const CudaExec& x, T* out, const T* a, const T* b, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("AddKernel", AddKernel<T>, dim3(GridBlocks(n, kThreads)),
                                     dim3(kThreads), 0, x.stream, out, a, b, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status AddTo(const CudaExec& x, T* out, const T* a, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("AddToKernel", AddToKernel<T>,
                                     dim3(GridBlocks(n, kThreads)), dim3(kThreads), 0, x.stream,
                                     out, a, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status Upload(const CudaExec& x, T* dst, const T* host_src, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(n) * sizeof(T),
                                              cudaMemcpyHostToDevice, x.stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status Download(const CudaExec& x, T* host_dst, const T* src, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(n) * sizeof(T),
                                              cudaMemcpyDeviceToHost, x.stream));
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(x.stream));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE_TRANSFER(T)                                       \
  template absl::Status Upload<T>(const CudaExec&, T*, const T*, int64_t); \
  template absl::Status Download<T>(const CudaExec&, T*, const T*, int64_t);
SATDAR_INSTANTIATE_TRANSFER(float)
SATDAR_INSTANTIATE_TRANSFER(__nv_bfloat16)
SATDAR_INSTANTIATE_TRANSFER(int32_t)
SATDAR_INSTANTIATE_TRANSFER(double)
#undef SATDAR_INSTANTIATE_TRANSFER

#define SATDAR_INSTANTIATE(T)                                                       \
  template absl::Status Copy<T>(const CudaExec&, T*, const T*, int64_t);            \
  template absl::Status Zero<T>(const CudaExec&, T*, int64_t);                      \
  template absl::Status Add<T>(const CudaExec&, T*, const T*, const T*, int64_t);   \
  template absl::Status AddTo<T>(const CudaExec&, T*, const T*, int64_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
