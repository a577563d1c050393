// CUDA side of core/ops/elementwise.h: grid-stride kernels in fp32, copies and fills as
// asynchronous memory operations on the stream. The fp64 sums have no atomics: AccumulateSum
// is one block (each thread a fixed strided slice, then a shared-memory tree); SumSquares a
// grid of ReduceBlocks(n) blocks the same way, then one thread adds the block sums in block
// order; AccumulateColumns one block per column the same way.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/reduce_grid.h"
#include "core/cuda/workspace.h"
#include "core/ops/elementwise.h"

namespace satdar::core::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, GridBlocks, BlockSums

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

// v = v * f, or v / f when divide (fp32 arithmetic).
template <typename T>
__global__ void ScaleKernel(T* v, int64_t n, float f, bool divide) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(v + i, divide ? Ld(v + i) / f : Ld(v + i) * f);
  }
}

template <typename T>
__global__ void CastKernel(T* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(out + i, in[i]);
  }
}

// One block of kThreads: the sum does not depend on any launch size but n.
__global__ void AccumulateSumKernel(double* acc, const float* v, int64_t n, double scale) {
  double s[1] = {0.0};
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s[0] += v[i];
  BlockSums<kThreads, 1>(s);
  if (threadIdx.x == 0) *acc += scale * s[0];
}

// Block c sums column c: thread t takes rows t, t + blockDim.x, ...; then a tree.
__global__ void AccumulateColumnsKernel(double* sums, double* zeros, const float* a,
                                        int64_t rows, int cols) {
  const int c = blockIdx.x;
  double s[2] = {0.0, 0.0};
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float v = a[r * cols + c];
    s[0] += v;
    s[1] += v == 0.0f ? 1.0 : 0.0;
  }
  BlockSums<kThreads, 2>(s);
  if (threadIdx.x == 0) {
    sums[c] += s[0];
    if (zeros != nullptr) zeros[c] += s[1];
  }
}

__global__ void AccumulateValueKernel(double* acc, double value) {
  if (threadIdx.x == 0) *acc += value;
}

__global__ void SumSquaresKernel(double* scratch, const float* v, int64_t n) {
  double s[1] = {0.0};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double e = v[i];
    s[0] += e * e;
  }
  BlockSums<kThreads, 1>(s);
  if (threadIdx.x == 0) scratch[blockIdx.x] = s[0];
}

__global__ void SumFinishKernel(double* out, const double* scratch, int blocks) {
  if (threadIdx.x != 0) return;
  double s = 0.0;
  for (int b = 0; b < blocks; ++b) s += scratch[b];
  *out = s;
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

absl::Status Synchronize(const CudaExec& x) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(x.stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status ScaleOrDivide(const CudaExec& x, T* v, int64_t n, double f, bool divide) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ScaleKernel", ScaleKernel<T>, dim3(GridBlocks(n, kThreads)),
                                     dim3(kThreads), 0, x.stream, v, n, static_cast<float>(f),
                                     divide));
  return absl::OkStatus();
}

template <typename T>
absl::Status Scale(const CudaExec& x, T* v, int64_t n, double s) {
  return ScaleOrDivide(x, v, n, s, false);
}

template <typename T>
absl::Status Divide(const CudaExec& x, T* v, int64_t n, double d) {
  return ScaleOrDivide(x, v, n, d, true);
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

template <typename T>
absl::Status CastFromF32(const CudaExec& x, T* out, const float* in, int64_t n) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("CastKernel", CastKernel<T>, dim3(GridBlocks(n, kThreads)),
                                     dim3(kThreads), 0, x.stream, out, in, n));
  return absl::OkStatus();
}

absl::Status AccumulateSum(const CudaExec& x, double* acc, const float* v, int64_t n,
                           double scale) {
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("AccumulateSumKernel", AccumulateSumKernel, dim3(1),
                                     dim3(kThreads), 0, x.stream, acc, v, n, scale));
  return absl::OkStatus();
}

absl::Status AccumulateValue(const CudaExec& x, double* acc, double value) {
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("AccumulateValueKernel", AccumulateValueKernel, dim3(1),
                                     dim3(1), 0, x.stream, acc, value));
  return absl::OkStatus();
}

absl::Status AccumulateColumns(const CudaExec& x, double* sums, double* zeros, const float* a,
                               int64_t rows, int cols) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("AccumulateColumnsKernel", AccumulateColumnsKernel,
                                     dim3(cols), dim3(kThreads), 0, x.stream, sums, zeros, a,
                                     rows, cols));
  return absl::OkStatus();
}

absl::Status SumSquares(const CudaExec& x, double* out, const float* v, int64_t n) {
  // n = 0 still launches (one block), so *out is written.
  const int blocks = ReduceBlocks(n, kThreads);
  absl::StatusOr<double*> scratch =
      Scratch<double>(x, static_cast<size_t>(blocks), "SumSquares");
  if (!scratch.ok()) return scratch.status();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SumSquaresKernel", SumSquaresKernel, dim3(blocks),
                                     dim3(kThreads), 0, x.stream, *scratch, v, n));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SumFinishKernel", SumFinishKernel, dim3(1), dim3(32), 0,
                                     x.stream, out, *scratch, blocks));
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
  template absl::Status AddTo<T>(const CudaExec&, T*, const T*, int64_t);           \
  template absl::Status Scale<T>(const CudaExec&, T*, int64_t, double);             \
  template absl::Status Divide<T>(const CudaExec&, T*, int64_t, double);            \
  template absl::Status CastFromF32<T>(const CudaExec&, T*, const float*, int64_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE
template absl::Status Zero<double>(const CudaExec&, double*, int64_t);  // fp64 accumulators

}  // namespace satdar::core::cuda
