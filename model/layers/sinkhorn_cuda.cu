// CUDA Sinkhorn normalisation of mHC (see sinkhorn_cuda.h and model/variants/mhc.cc): one
// thread per token, the same loops as the CPU code in fp32. The matrices are tiny (n <= 8),
// so a token's work stays in one thread; the backward keeps dM in registers / local memory.
#include "model/layers/sinkhorn_cuda.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/launch.h"

namespace satdar::model::cuda {

namespace {

using ::satdar::core::cuda::Launch;

constexpr int kBlockSize = 128;
constexpr int kMaxEntries = kMaxSinkhornStreams * kMaxSinkhornStreams;

__global__ void ForwardKernel(float* steps, const float* logits, int rows, int n, int nsteps) {
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

__global__ void BackwardKernel(float* dlogits, const float* dfinal, const float* steps, int rows,
                               int n, int nsteps) {
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

unsigned Blocks(int rows) { return static_cast<unsigned>((rows + kBlockSize - 1) / kBlockSize); }
}  // namespace

cudaError_t SinkhornForward(float* steps, const float* logits, int rows, int n, int iterations,
                            cudaStream_t stream) {
  if (n < 1 || n > kMaxSinkhornStreams || iterations < 1) return cudaErrorInvalidValue;
  if (rows <= 0) return cudaSuccess;
  return Launch("SinkhornForwardKernel", ForwardKernel, dim3(Blocks(rows)), dim3(kBlockSize), 0,
                stream, steps, logits, rows, n, 2 * iterations);
}

cudaError_t SinkhornBackward(float* dlogits, const float* dfinal, const float* steps, int rows,
                             int n, int iterations, cudaStream_t stream) {
  if (n < 1 || n > kMaxSinkhornStreams || iterations < 1) return cudaErrorInvalidValue;
  if (rows <= 0) return cudaSuccess;
  return Launch("SinkhornBackwardKernel", BackwardKernel, dim3(Blocks(rows)), dim3(kBlockSize), 0,
                stream, dlogits, dfinal, steps, rows, n, 2 * iterations);
}

}  // namespace satdar::model::cuda
