// MUDDFormer's dense connection on the GPU (muddformer_ops.h; muddformer_ops_cpu.cc is the
// reference). GELU is elementwise. The combination runs a thread per output element (way w,
// token r, channel e) over the sources in order, and its backward a thread per dX_j element
// over the ways in order; the dots <X_j, dout_w> run a block per (token, source) with a fixed
// tree (BlockSums), and the static weights' gradient sums da over the tokens with ColumnSums
// (hyper_ops.h: a fixed partition and tree). No atomics: bit-identical run to run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "model/variants/hyper_ops.h"
#include "model/variants/muddformer_ops.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;
constexpr int kW = kMaxMuddWays;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

absl::Status CheckWays(int ways, int sources, int ld) {
  if (ways < 1 || ways > kMaxMuddWays || ld < ways * sources) {
    return absl::InvalidArgumentError(absl::StrCat("DenseCombine: ways ", ways, " (1..",
                                                   kMaxMuddWays, "), sources ", sources, ", ld ",
                                                   ld));
  }
  return absl::OkStatus();
}

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

// Thread per (way w, token r, channel e): outs[w][r, e] = sum_j (a + stat)[r, w*s + j] X_j[r, e].
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

// Thread per (source j, token r, channel e): dX_j[r, e] += sum_w (a + stat)[r, w*s + j]
// douts[w][r, e], in way order.
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

// Block (token r, source j): <X_j, douts[w]> over the C channels for every way, into da (fp32)
// and da_t (T) at column w*s + j; block j == 0 zeroes the row's padding columns.
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
absl::Status GeluForward(const core::CudaExec& x, T* g, const T* h, int64_t n) {
  cudaStream_t stream = x.stream;
  if (n <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MuddGeluKernel", GeluKernel<T>, dim3(Blocks(n)),
                                     dim3(kThreads), 0, stream, g, h, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status GeluBackward(const core::CudaExec& x, T* dh, const T* dg, const T* h, int64_t n) {
  cudaStream_t stream = x.stream;
  if (n <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MuddGeluBackwardKernel", GeluBackwardKernel<T>,
                                     dim3(Blocks(n)), dim3(kThreads), 0, stream, dh, dg, h, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status DenseCombineForward(const core::CudaExec& x, T* const* outs, int ways,
                                 const T* const* xs, int sources, const float* a, int ld,
                                 const float* stat, int rows, int c) {
  cudaStream_t stream = x.stream;
  if (absl::Status status = CheckWays(ways, sources, ld); !status.ok()) return status;
  const int64_t total = static_cast<int64_t>(rows) * c * ways;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DenseCombineKernel", CombineKernel<T>,
                                     dim3(Blocks(total)), dim3(kThreads), 0, stream, outs, ways,
                                     xs, sources, a, ld, stat, rows, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status DenseCombineBackward(const core::CudaExec& x, float* da, T* da_t, float* grad_stat,
                                  T* const* dxs, const T* const* douts, int ways,
                                  const T* const* xs, int sources, const float* a, int ld,
                                  const float* stat, int rows, int c) {
  cudaStream_t stream = x.stream;
  if (absl::Status status = CheckWays(ways, sources, ld); !status.ok()) return status;
  if (rows <= 0 || sources <= 0) return absl::OkStatus();
  // The dots read xs before the dx kernel writes dxs (which must not alias xs or douts).
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DenseCombineDotsKernel", CombineDotsKernel<T>,
                                     dim3(rows, sources), dim3(kThreads), 0, stream, da, da_t,
                                     douts, ways, xs, sources, ld, c));
  SATDAR_RETURN_IF_ERROR(ColumnSums(x, grad_stat, da, rows, ways * sources, ld));
  const int64_t total = static_cast<int64_t>(rows) * c * sources;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DenseCombineDxKernel", CombineDxKernel<T>,
                                     dim3(Blocks(total)), dim3(kThreads), 0, stream, dxs, douts,
                                     ways, sources, a, ld, stat, rows, c));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                     \
  template absl::Status GeluForward<T>(const core::CudaExec&, T*, const T*, int64_t);             \
  template absl::Status GeluBackward<T>(const core::CudaExec&, T*, const T*, const T*, int64_t);  \
  template absl::Status DenseCombineForward<T>(const core::CudaExec&, T* const*, int,             \
                                               const T* const*, int, const float*, int,           \
                                               const float*, int, int);                           \
  template absl::Status DenseCombineBackward<T>(const core::CudaExec&, float*, T*, float*,        \
                                                T* const*, const T* const*, int, const T* const*, \
                                                int, const float*, int, const float*, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
