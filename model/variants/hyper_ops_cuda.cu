// mHC's coefficients on the GPU (hyper_ops.h; hyper_ops_cpu.cc is the reference). The kernels
// moved here unchanged from hyper_cuda.cu (MhcRms, MhcCoefForward, MhcCoefBackward, RowScaleAdd)
// and layers/sinkhorn_cuda.cu (the Sinkhorn forward and backward). MhcRms runs a block per
// token with a fixed tree (BlockSums); the coefficients and the Sinkhorn a thread per token
// (the matrices are tiny, n <= kMaxHyperStreams: a token's dM stays in registers / local
// memory); the sums over tokens are ColumnSums (hyper_cuda.h: a fixed partition and tree).
// No atomics: bit-identical run to run, and to the kernels before the move.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "model/variants/hyper_cuda.h"
#include "model/variants/hyper_ops.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;      // MhcRms's block, RowScaleAdd's grid stride
constexpr int kTokenBlock = 128;   // the thread-per-token kernels
constexpr int kMaxEntries = kMaxHyperStreams * kMaxHyperStreams;

unsigned TokenBlocks(int rows) {
  return static_cast<unsigned>((rows + kTokenBlock - 1) / kTokenBlock);
}

absl::Status CheckShape(const char* op, int n, int ld, int iterations = 1) {
  if (n < 1 || n > kMaxHyperStreams || ld < n * (n + 2) || iterations < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": n ", n, " (1..", kMaxHyperStreams,
                                                   "), ld ", ld, ", iterations ", iterations));
  }
  return absl::OkStatus();
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void MhcRmsKernel(float* rms, const T* h, int nc, float eps) {
  const int64_t r = blockIdx.x;
  float acc[1] = {0.0f};
  for (int e = threadIdx.x; e < nc; e += blockDim.x) {
    const float x = Ld(h + r * nc + e);
    acc[0] += x * x;
  }
  BlockSums<kThreads, 1>(acc);
  if (threadIdx.x == 0) rms[r] = 1.0f / sqrtf(acc[0] / nc + eps);
}

__global__ void MhcCoefForwardKernel(float* coef, float* logits, const float* raw, int ld,
                                     const float* rms, const float* scale, const float* base,
                                     int rows, int n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* x = raw + r * ld;
  const float s = rms[r];
  for (int j = 0; j < n; ++j) {
    coef[r * 2 * n + j] = Sigmoid(scale[0] * x[j] * s + base[j]);
    coef[r * 2 * n + n + j] = 2.0f * Sigmoid(scale[1] * x[n + j] * s + base[n + j]);
  }
  for (int k = 0; k < n * n; ++k) {
    logits[r * n * n + k] = scale[2] * x[2 * n + k] * s + base[2 * n + k];
  }
}

__global__ void SinkhornForwardKernel(float* steps, const float* logits, int rows, int n,
                                      int nsteps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int nn = n * n;
  const float* z = logits + r * nn;
  float* m = steps + r * nsteps * nn;
  for (int j = 0; j < n; ++j) {
    float* row = m + j * n;
    float mx = z[j * n];
    for (int k = 1; k < n; ++k) mx = fmaxf(mx, z[j * n + k]);
    float sum = 0.0f;
    for (int k = 0; k < n; ++k) sum += row[k] = expf(z[j * n + k] - mx);
    for (int k = 0; k < n; ++k) row[k] /= sum;
  }
  for (int step = 1; step < nsteps; ++step) {
    const float* a = m + (step - 1) * nn;
    float* b = m + step * nn;
    const bool column = step % 2 == 1;
    for (int q = 0; q < n; ++q) {
      float sum = 0.0f;
      for (int t = 0; t < n; ++t) sum += column ? a[t * n + q] : a[q * n + t];
      for (int t = 0; t < n; ++t) {
        const int idx = column ? t * n + q : q * n + t;
        b[idx] = a[idx] / sum;
      }
    }
  }
}

__global__ void SinkhornBackwardKernel(float* dlogits, const float* dfinal, const float* steps,
                                       int rows, int n, int nsteps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int nn = n * n;
  const float* m = steps + r * nsteps * nn;
  float dm[kMaxEntries], da[kMaxEntries];
  for (int k = 0; k < nn; ++k) dm[k] = dfinal[r * nn + k];
  // Back through the normalisations: b = a / sum, so da = (db - sum_t db_t b_t) / sum.
  for (int step = nsteps - 1; step >= 1; --step) {
    const float* a = m + (step - 1) * nn;
    const float* b = m + step * nn;
    const bool column = step % 2 == 1;
    for (int q = 0; q < n; ++q) {
      float sum = 0.0f, dot = 0.0f;
      for (int t = 0; t < n; ++t) {
        const int idx = column ? t * n + q : q * n + t;
        sum += a[idx];
        dot += dm[idx] * b[idx];
      }
      for (int t = 0; t < n; ++t) {
        const int idx = column ? t * n + q : q * n + t;
        da[idx] = (dm[idx] - dot) / sum;
      }
    }
    for (int k = 0; k < nn; ++k) dm[k] = da[k];
  }
  // Then the row softmax.
  float* dz = dlogits + r * nn;
  for (int j = 0; j < n; ++j) {
    const float* row = m + j * n;
    float dot = 0.0f;
    for (int k = 0; k < n; ++k) dot += dm[j * n + k] * row[k];
    for (int k = 0; k < n; ++k) dz[j * n + k] = row[k] * (dm[j * n + k] - dot);
  }
}

// Per token: dz (N, mixes), draw (N, ld), scales (N, 3) = sum dz raw rms per group, rowcoef
// (N) = -rms^3 / nc sum dz scale raw.
template <typename T>
__global__ void MhcCoefBackwardKernel(T* draw, float* dz, float* scales, float* rowcoef,
                                      const float* dcoef, const float* dlogits, const float* coef,
                                      const float* raw, int ld, const float* rms,
                                      const float* scale, int rows, int n, int nc) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int mixes = n * (n + 2);
  const float* x = raw + r * ld;
  const float* dc = dcoef + r * mixes;
  const float s = rms[r];
  float* z = dz + r * mixes;
  for (int j = 0; j < n; ++j) {
    const float pre = coef[r * 2 * n + j], post = coef[r * 2 * n + n + j];
    z[j] = dc[j] * pre * (1.0f - pre);
    z[n + j] = dc[n + j] * post * (1.0f - post / 2.0f);  // post = 2 sigmoid
  }
  for (int k = 0; k < n * n; ++k) z[2 * n + k] = dlogits[r * n * n + k];
  float group[3] = {0.0f, 0.0f, 0.0f};
  float drms = 0.0f;
  for (int k = 0; k < mixes; ++k) {
    const int g = k < n ? 0 : (k < 2 * n ? 1 : 2);
    group[g] += z[k] * x[k] * s;
    drms += z[k] * scale[g] * x[k];
    St(draw + r * ld + k, z[k] * scale[g] * s);
  }
  for (int k = mixes; k < ld; ++k) St(draw + r * ld + k, 0.0f);
  for (int g = 0; g < 3; ++g) scales[r * 3 + g] = group[g];
  rowcoef[r] = -drms * s * s * s / nc;
}

// dh (N, nc) += rowcoef[r] h.
template <typename T>
__global__ void RowScaleAddKernel(T* dh, const float* rowcoef, const T* h, int64_t rows, int nc) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * nc;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(dh + i, Ld(dh + i) + rowcoef[i / nc] * Ld(h + i));
  }
}

}  // namespace

template <typename T>
absl::Status MhcRms(float* rms, const T* h, int rows, int nc, float eps, cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MhcRmsKernel", MhcRmsKernel<T>, dim3(rows),
                                     dim3(kThreads), 0, stream, rms, h, nc, eps));
  return absl::OkStatus();
}

absl::Status MhcCoefForward(float* coef, float* logits, const float* raw, int ld,
                            const float* rms, const float* scale, const float* base, int rows,
                            int n, cudaStream_t stream) {
  if (absl::Status status = CheckShape("MhcCoefForward", n, ld); !status.ok()) return status;
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MhcCoefForwardKernel", MhcCoefForwardKernel,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream, coef,
                                     logits, raw, ld, rms, scale, base, rows, n));
  return absl::OkStatus();
}

absl::Status SinkhornForward(float* steps, const float* logits, int rows, int n, int iterations,
                             cudaStream_t stream) {
  if (absl::Status status = CheckShape("SinkhornForward", n, n * (n + 2), iterations);
      !status.ok()) {
    return status;
  }
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SinkhornForwardKernel", SinkhornForwardKernel,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream, steps,
                                     logits, rows, n, 2 * iterations));
  return absl::OkStatus();
}

absl::Status SinkhornBackward(float* dlogits, const float* dfinal, const float* steps, int rows,
                              int n, int iterations, cudaStream_t stream) {
  if (absl::Status status = CheckShape("SinkhornBackward", n, n * (n + 2), iterations);
      !status.ok()) {
    return status;
  }
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SinkhornBackwardKernel", SinkhornBackwardKernel,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream,
                                     dlogits, dfinal, steps, rows, n, 2 * iterations));
  return absl::OkStatus();
}

template <typename T>
absl::Status MhcCoefBackward(T* draw, float* dz, float* work, float* grad_scale,
                             float* grad_base, T* dh, const float* dcoef, const float* dlogits,
                             const float* coef, const float* raw, int ld, const float* rms,
                             const float* scale, const T* h, int rows, int n, int nc,
                             cudaStream_t stream) {
  if (absl::Status status = CheckShape("MhcCoefBackward", n, ld); !status.ok()) return status;
  if (rows <= 0) return absl::OkStatus();
  const int mixes = n * (n + 2);
  float* scales = work;                                   // (N, 3)
  float* rowcoef = work + static_cast<int64_t>(rows) * 3;  // (N)
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MhcCoefBackwardKernel", MhcCoefBackwardKernel<T>,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream, draw,
                                     dz, scales, rowcoef, dcoef, dlogits, coef, raw, ld, rms,
                                     scale, rows, n, nc));
  SATDAR_CUDA_RETURN_IF_ERROR(ColumnSums(grad_base, dz, rows, mixes, mixes, stream));
  SATDAR_CUDA_RETURN_IF_ERROR(ColumnSums(grad_scale, scales, rows, 3, 3, stream));
  const int64_t total = static_cast<int64_t>(rows) * nc;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RowScaleAddKernel", RowScaleAddKernel<T>,
                                     dim3(GridBlocks(total, kThreads)), dim3(kThreads), 0, stream,
                                     dh, rowcoef, h, static_cast<int64_t>(rows), nc));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template absl::Status MhcRms<T>(float*, const T*, int, int, float, cudaStream_t);            \
  template absl::Status MhcCoefBackward<T>(T*, float*, float*, float*, float*, T*,             \
                                           const float*, const float*, const float*,           \
                                           const float*, int, const float*, const float*,      \
                                           const T*, int, int, int, cudaStream_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
