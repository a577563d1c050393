// HC's and mHC's ops on the GPU (hyper_ops.h; hyper_ops_cpu.cc is the reference). The kernels
// are those of the former hyper_cuda.cu (stream entry / exit, the width and depth connections,
// HC's coefficients, ColumnSums; mHC's MhcRms, MhcCoefForward, MhcCoefBackward, RowScaleAdd)
// and layers/sinkhorn_cuda.cu (the Sinkhorn forward and backward), arithmetic unchanged, and
// a pipeline boundary's join / split of the streams (copies through a device pointer array).
// Elementwise kernels walk (token, stream, channel) with a grid stride; the dot products of
// the mixing backward and MhcRms run a block per token (or token and stream), each thread a
// fixed channel slice, then a fixed tree (BlockSums); the coefficients and the Sinkhorn a
// thread per token (the matrices are tiny, n <= kMaxHyperStreams: a token's dM stays in
// registers / local memory); the sums over tokens are ColumnSums (a fixed partition and tree).
// No atomics: bit-identical run to run, and to the kernels before the move.
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
#include "core/cuda/workspace.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;      // the per-token blocks and the grid-stride kernels
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

absl::Status CheckStreams(const char* op, int n) {
  if (n < 1 || n > kMaxHyperStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": n ", n, " (1..", kMaxHyperStreams, ")"));
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

// ---- The stream mixing and HC's coefficients.

constexpr int kS = kMaxHyperStreams;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

__device__ __forceinline__ float Pre(const HyperCoefs<float>& c, int64_t r, int j) {
  return c.pre[r * c.pre_token + j * c.pre_step];
}
__device__ __forceinline__ float Post(const HyperCoefs<float>& c, int64_t r, int m) {
  return c.post[r * c.post_token + m];
}
__device__ __forceinline__ float Res(const HyperCoefs<float>& c, int64_t r, int j, int m) {
  return c.res[r * c.res_token + j * c.res_row + m];
}

template <typename T>
__global__ void BroadcastKernel(T* out, const T* in, int64_t rows, int n, int c) {
  const int64_t total = rows * n * c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / (static_cast<int64_t>(n) * c);
    out[i] = in[r * c + i % c];
  }
}

template <typename T>
__global__ void SumKernel(T* out, const T* in, int64_t rows, int n, int c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * c;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, e = i % c;
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += Ld(in + (r * n + j) * c + e);
    St(out + i, s);
  }
}

// i walks hyper (rows, n, c): token r, stream j, channel e; part j holds (rows, c).
template <typename T>
__global__ void JoinKernel(T* hyper, const T* const* parts, int64_t rows, int n, int c) {
  const int64_t total = rows * n * c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t rj = i / c, e = i % c;
    const int64_t r = rj / n;
    const int j = static_cast<int>(rj % n);
    hyper[i] = parts[j][r * c + e];
  }
}

template <typename T>
__global__ void SplitKernel(T* const* parts, const T* hyper, int64_t rows, int n, int c) {
  const int64_t total = rows * n * c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t rj = i / c, e = i % c;
    const int64_t r = rj / n;
    const int j = static_cast<int>(rj % n);
    parts[j][r * c + e] = hyper[i];
  }
}

template <typename T>
__global__ void WidthKernel(T* u, const T* h, HyperCoefs<float> coefs, int64_t rows, int n,
                            int c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * c;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, e = i % c;
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += Pre(coefs, r, j) * Ld(h + (r * n + j) * c + e);
    St(u + i, s);
  }
}

template <typename T>
__global__ void DepthKernel(T* h_out, const T* h, const T* y, HyperCoefs<float> coefs,
                            int64_t rows, int n, int c) {
  const int64_t total = rows * n * c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % c, rm = i / c;
    const int64_t r = rm / n;
    const int m = static_cast<int>(rm % n);
    float s = Post(coefs, r, m) * Ld(y + r * c + e);
    for (int j = 0; j < n; ++j) s += Res(coefs, r, j, m) * Ld(h + (r * n + j) * c + e);
    St(h_out + i, s);
  }
}

// dy = sum_m post_m g_m; dh_j = sum_m res_jm g_m (both written).
template <typename T>
__global__ void DepthBackwardKernel(T* dy, T* dh, const T* g, HyperCoefs<float> coefs,
                                    int64_t rows, int n, int c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * c;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, e = i % c;
    float gm[kS];
    float s = 0.0f;
#pragma unroll
    for (int m = 0; m < kS; ++m) {
      gm[m] = m < n ? Ld(g + (r * n + m) * c + e) : 0.0f;
      if (m < n) s += Post(coefs, r, m) * gm[m];
    }
    St(dy + i, s);
    for (int j = 0; j < n; ++j) {
      float d = 0.0f;
#pragma unroll
      for (int m = 0; m < kS; ++m) {
        if (m < n) d += Res(coefs, r, j, m) * gm[m];
      }
      St(dh + (r * n + j) * c + e, d);
    }
  }
}

// Block (token r, stream m): dpost_m = <y, g_m>, dres_jm = <H_j, g_m>.
template <typename T>
__global__ void DepthDotsKernel(HyperCoefs<float> dcoefs, const T* g, const T* y, const T* h,
                                int n, int c) {
  const int64_t r = blockIdx.x;
  const int m = blockIdx.y;
  float acc[kS + 1];
#pragma unroll
  for (int j = 0; j <= kS; ++j) acc[j] = 0.0f;
  const T* gm = g + (r * n + m) * c;
  for (int e = threadIdx.x; e < c; e += blockDim.x) {
    const float ge = Ld(gm + e);
    acc[kS] += Ld(y + r * c + e) * ge;
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      if (j < n) acc[j] += Ld(h + (r * n + j) * c + e) * ge;
    }
  }
  BlockSums<kThreads, kS + 1>(acc);
  if (threadIdx.x == 0) {
    dcoefs.post[r * dcoefs.post_token + m] = acc[kS];
    for (int j = 0; j < n; ++j) dcoefs.res[r * dcoefs.res_token + j * dcoefs.res_row + m] = acc[j];
  }
}

// dh_j += pre_j du.
template <typename T>
__global__ void WidthBackwardKernel(T* dh, const T* du, HyperCoefs<float> coefs, int64_t rows,
                                    int n, int c) {
  const int64_t total = rows * n * c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % c, rj = i / c;
    const int64_t r = rj / n;
    const int j = static_cast<int>(rj % n);
    St(dh + i, Ld(dh + i) + Pre(coefs, r, j) * Ld(du + r * c + e));
  }
}

// Block per token: dpre_j = <H_j, du>.
template <typename T>
__global__ void WidthDotsKernel(HyperCoefs<float> dcoefs, const T* du, const T* h, int n, int c) {
  const int64_t r = blockIdx.x;
  float acc[kS];
#pragma unroll
  for (int j = 0; j < kS; ++j) acc[j] = 0.0f;
  for (int e = threadIdx.x; e < c; e += blockDim.x) {
    const float d = Ld(du + r * c + e);
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      if (j < n) acc[j] += Ld(h + (r * n + j) * c + e) * d;
    }
  }
  BlockSums<kThreads, kS>(acc);
  if (threadIdx.x == 0) {
    for (int j = 0; j < n; ++j) dcoefs.pre[r * dcoefs.pre_token + j * dcoefs.pre_step] = acc[j];
  }
}

__global__ void ColumnSumsKernel(float* out, const float* in, int rows, int ld) {
  const int k = blockIdx.x;
  float acc[1] = {0.0f};
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    acc[0] += in[static_cast<int64_t>(r) * ld + k];
  }
  BlockSums<kThreads, 1>(acc);
  if (threadIdx.x == 0) out[k] += acc[0];
}

// Thread per token: ta, tb <- tanh; coef (N, n(n+2)) in HcCoefs' layout.
__global__ void HcCoefForwardKernel(float* coef, float* ta, int lda, float* tb, int ldb,
                                    const float* static_alpha, const float* static_beta,
                                    const float* alpha_scale, const float* beta_scale, int rows,
                                    int n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float sa = *alpha_scale, sb = *beta_scale;
  float* out = coef + r * n * (n + 2);
  for (int j = 0; j < n; ++j) {
    float* z = ta + (r * n + j) * lda;
    for (int k = 0; k <= n; ++k) {
      const float t = tanhf(z[k]);
      z[k] = t;
      out[j * (n + 1) + k] = static_alpha[j * (n + 1) + k] + sa * t;
    }
    float* zb = tb + (r * n + j) * ldb;
    const float t = tanhf(*zb);
    *zb = t;
    out[n * (n + 1) + j] = static_beta[j] + sb * t;
  }
}

// Thread per token: dta, dtb; scales (N, 2) = per token sum dalpha tanh, sum dbeta tanh.
template <typename T>
__global__ void HcCoefBackwardKernel(T* dta, T* dtb, float* scales, const float* dcoef,
                                     const float* ta, int lda, const float* tb, int ldb,
                                     const float* alpha_scale, const float* beta_scale, int rows,
                                     int n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float sa = *alpha_scale, sb = *beta_scale;
  const float* dc = dcoef + r * n * (n + 2);
  float dsa = 0.0f, dsb = 0.0f;
  for (int j = 0; j < n; ++j) {
    const int64_t row = r * n + j;
    const float* t = ta + row * lda;
    T* out = dta + row * lda;
    for (int k = 0; k <= n; ++k) {
      const float da = dc[j * (n + 1) + k];
      dsa += da * t[k];
      St(out + k, da * sa * (1.0f - t[k] * t[k]));
    }
    const float db = dc[n * (n + 1) + j], tj = tb[row * ldb];
    dsb += db * tj;
    St(dtb + row * ldb, db * sb * (1.0f - tj * tj));
  }
  scales[2 * r] = dsa;
  scales[2 * r + 1] = dsb;
}

// Also refuses a tb that lies inside ta's rows but overlaps their n+1 columns (one buffer
// with ld < n+2: tb's row r would be ta's row r+1).
absl::Status CheckHc(const char* op, int n, const float* ta, int lda, const float* tb, int ldb,
                     int rows) {
  if (n < 1 || n > kMaxHyperStreams || lda < n + 1 || ldb < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": n ", n, " (1..", kMaxHyperStreams,
                                                   "), lda ", lda, ", ldb ", ldb));
  }
  const auto a = reinterpret_cast<uintptr_t>(ta), b = reinterpret_cast<uintptr_t>(tb);
  const uintptr_t a_end = a + sizeof(float) * static_cast<size_t>(rows) * lda;
  if (rows > 0 && b >= a && b < a_end) {
    const size_t col = (b - a) / sizeof(float) % static_cast<size_t>(lda);
    if (ldb != lda || col < static_cast<size_t>(n) + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": tb overlaps ta's n+1 columns (one buffer needs ld >= n+2 = ", n + 2,
          " and ldb == lda), lda ", lda, ", ldb ", ldb, ", column ", col));
    }
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status MhcRms(const core::CudaExec& x, float* rms, const T* h, int rows, int nc, float eps) {
  cudaStream_t stream = x.stream;
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MhcRmsKernel", MhcRmsKernel<T>, dim3(rows),
                                     dim3(kThreads), 0, stream, rms, h, nc, eps));
  return absl::OkStatus();
}

absl::Status MhcCoefForward(const core::CudaExec& x, float* coef, float* logits, const float* raw,
                            int ld, const float* rms, const float* scale, const float* base,
                            int rows, int n) {
  cudaStream_t stream = x.stream;
  if (absl::Status status = CheckShape("MhcCoefForward", n, ld); !status.ok()) return status;
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MhcCoefForwardKernel", MhcCoefForwardKernel,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream, coef,
                                     logits, raw, ld, rms, scale, base, rows, n));
  return absl::OkStatus();
}

absl::Status SinkhornForward(const core::CudaExec& x, float* steps, const float* logits, int rows,
                             int n, int iterations) {
  cudaStream_t stream = x.stream;
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

absl::Status SinkhornBackward(const core::CudaExec& x, float* dlogits, const float* dfinal,
                              const float* steps, int rows, int n, int iterations) {
  cudaStream_t stream = x.stream;
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
absl::Status MhcCoefBackward(const core::CudaExec& x, T* draw, float* dz, float* grad_scale,
                             float* grad_base, T* dh, const float* dcoef, const float* dlogits,
                             const float* coef, const float* raw, int ld, const float* rms,
                             const float* scale, const T* h, int rows, int n, int nc) {
  cudaStream_t stream = x.stream;
  if (absl::Status status = CheckShape("MhcCoefBackward", n, ld); !status.ok()) return status;
  if (rows <= 0) return absl::OkStatus();
  const int mixes = n * (n + 2);
  // One region for both (a second Get could move the first).
  SATDAR_ASSIGN_OR_RETURN(float* work,
                          core::cuda::Scratch<float>(x, static_cast<size_t>(rows) * 4, "MhcCoefBackward"));
  float* scales = work;                                   // (N, 3)
  float* rowcoef = work + static_cast<int64_t>(rows) * 3;  // (N)
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("MhcCoefBackwardKernel", MhcCoefBackwardKernel<T>,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream, draw,
                                     dz, scales, rowcoef, dcoef, dlogits, coef, raw, ld, rms,
                                     scale, rows, n, nc));
  SATDAR_RETURN_IF_ERROR(ColumnSums(x, grad_base, dz, rows, mixes, mixes));
  SATDAR_RETURN_IF_ERROR(ColumnSums(x, grad_scale, scales, rows, 3, 3));
  const int64_t total = static_cast<int64_t>(rows) * nc;
  if (total <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RowScaleAddKernel", RowScaleAddKernel<T>,
                                     dim3(GridBlocks(total, kThreads)), dim3(kThreads), 0, stream,
                                     dh, rowcoef, h, static_cast<int64_t>(rows), nc));
  return absl::OkStatus();
}

// ---- The stream mixing.

template <typename T>
absl::Status StreamsBroadcast(const core::CudaExec& x, T* out, const T* in, int rows, int n,
                              int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("StreamsBroadcast", n));
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("BroadcastKernel", BroadcastKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * n * c)),
                                     dim3(kThreads), 0, stream, out, in, rows, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status StreamsSum(const core::CudaExec& x, T* out, const T* in, int rows, int n, int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("StreamsSum", n));
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SumKernel", SumKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * c)),
                                     dim3(kThreads), 0, stream, out, in, rows, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status JoinStreams(const core::CudaExec& x, T* hyper, const T* const* parts, int rows, int n,
                         int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("JoinStreams", n));
  if (rows <= 0 || c <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("JoinKernel", JoinKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * n * c)),
                                     dim3(kThreads), 0, stream, hyper, parts, rows, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status SplitStreams(const core::CudaExec& x, T* const* parts, const T* hyper, int rows, int n,
                          int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("SplitStreams", n));
  if (rows <= 0 || c <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SplitKernel", SplitKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * n * c)),
                                     dim3(kThreads), 0, stream, parts, hyper, rows, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status HyperWidthForward(const core::CudaExec& x, T* u, const T* h,
                               const HyperCoefs<float>& coefs, int rows, int n, int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("HyperWidthForward", n));
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("WidthKernel", WidthKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * c)),
                                     dim3(kThreads), 0, stream, u, h, coefs, rows, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status HyperDepthForward(const core::CudaExec& x, T* h_out, const T* h, const T* y,
                               const HyperCoefs<float>& coefs, int rows, int n, int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("HyperDepthForward", n));
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthKernel", DepthKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * n * c)),
                                     dim3(kThreads), 0, stream, h_out, h, y, coefs, rows, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status HyperDepthBackward(const core::CudaExec& x, T* dy, T* dh,
                                const HyperCoefs<float>& dcoefs, const T* g, const T* y, const T* h,
                                const HyperCoefs<float>& coefs, int rows, int n, int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("HyperDepthBackward", n));
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthBackwardKernel", DepthBackwardKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * c)),
                                     dim3(kThreads), 0, stream, dy, dh, g, coefs, rows, n, c));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthDotsKernel", DepthDotsKernel<T>, dim3(rows, n),
                                     dim3(kThreads), 0, stream, dcoefs, g, y, h, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status HyperWidthBackward(const core::CudaExec& x, T* dh, const HyperCoefs<float>& dcoefs,
                                const T* du, const T* h, const HyperCoefs<float>& coefs, int rows,
                                int n, int c) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckStreams("HyperWidthBackward", n));
  if (rows <= 0) return absl::OkStatus();
  // The dots read h and du only, so they may run before dh changes.
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("WidthDotsKernel", WidthDotsKernel<T>, dim3(rows),
                                     dim3(kThreads), 0, stream, dcoefs, du, h, n, c));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("WidthBackwardKernel", WidthBackwardKernel<T>,
                                     dim3(Blocks(static_cast<int64_t>(rows) * n * c)),
                                     dim3(kThreads), 0, stream, dh, du, coefs, rows, n, c));
  return absl::OkStatus();
}

absl::Status ColumnSums(const core::CudaExec& x, float* out, const float* in, int rows, int cols,
                        int ld) {
  cudaStream_t stream = x.stream;
  if (cols == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ColumnSumsKernel", ColumnSumsKernel, dim3(cols),
                                     dim3(kThreads), 0, stream, out, in, rows, ld));
  return absl::OkStatus();
}

// ---- HC's coefficients.

absl::Status HcCoefForward(const core::CudaExec& x, float* coef, float* ta, int lda, float* tb,
                           int ldb, const float* static_alpha, const float* static_beta,
                           const float* alpha_scale, const float* beta_scale, int rows, int n) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckHc("HcCoefForward", n, ta, lda, tb, ldb, rows));
  if (rows <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("HcCoefForwardKernel", HcCoefForwardKernel,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream, coef,
                                     ta, lda, tb, ldb, static_alpha, static_beta, alpha_scale,
                                     beta_scale, rows, n));
  return absl::OkStatus();
}

template <typename T>
absl::Status HcCoefBackward(const core::CudaExec& x, T* dta, T* dtb, float* grad_static_alpha,
                            float* grad_static_beta, float* grad_alpha_scale,
                            float* grad_beta_scale, const float* dcoef, const float* ta, int lda,
                            const float* tb, int ldb, const float* alpha_scale,
                            const float* beta_scale, int rows, int n) {
  cudaStream_t stream = x.stream;
  SATDAR_RETURN_IF_ERROR(CheckHc("HcCoefBackward", n, ta, lda, tb, ldb, rows));
  if (rows <= 0) return absl::OkStatus();
  SATDAR_ASSIGN_OR_RETURN(float* work,
                          core::cuda::Scratch<float>(x, static_cast<size_t>(rows) * 2, "HcCoefBackward"));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("HcCoefBackwardKernel", HcCoefBackwardKernel<T>,
                                     dim3(TokenBlocks(rows)), dim3(kTokenBlock), 0, stream, dta,
                                     dtb, work, dcoef, ta, lda, tb, ldb, alpha_scale, beta_scale,
                                     rows, n));
  const int cols = n * (n + 2);
  SATDAR_RETURN_IF_ERROR(ColumnSums(x, grad_static_alpha, dcoef, rows, n * (n + 1), cols));
  SATDAR_RETURN_IF_ERROR(ColumnSums(x, grad_static_beta, dcoef + n * (n + 1), rows, n, cols));
  SATDAR_RETURN_IF_ERROR(ColumnSums(x, grad_alpha_scale, work, rows, 1, 2));
  SATDAR_RETURN_IF_ERROR(ColumnSums(x, grad_beta_scale, work + 1, rows, 1, 2));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template absl::Status MhcRms<T>(const core::CudaExec&, float*, const T*, int, int, float);       \
  template absl::Status MhcCoefBackward<T>(                                                        \
      const core::CudaExec&, T*, float*, float*, float*, T*, const float*, const float*,           \
      const float*, const float*, int, const float*, const float*, const T*, int, int, int);       \
  template absl::Status StreamsBroadcast<T>(const core::CudaExec&, T*, const T*, int, int, int);   \
  template absl::Status StreamsSum<T>(const core::CudaExec&, T*, const T*, int, int, int);         \
  template absl::Status JoinStreams<T>(const core::CudaExec&, T*, const T* const*, int, int, int); \
  template absl::Status SplitStreams<T>(const core::CudaExec&, T* const*, const T*, int, int, int);\
  template absl::Status HyperWidthForward<T>(const core::CudaExec&, T*, const T*,                  \
                                             const HyperCoefs<float>&, int, int, int);             \
  template absl::Status HyperDepthForward<T>(const core::CudaExec&, T*, const T*, const T*,        \
                                             const HyperCoefs<float>&, int, int, int);             \
  template absl::Status HyperDepthBackward<T>(const core::CudaExec&, T*, T*,                       \
                                              const HyperCoefs<float>&, const T*, const T*,        \
                                              const T*, const HyperCoefs<float>&, int, int, int);  \
  template absl::Status HyperWidthBackward<T>(const core::CudaExec&, T*, const HyperCoefs<float>&, \
                                              const T*, const T*, const HyperCoefs<float>&, int,   \
                                              int, int);                                           \
  template absl::Status HcCoefBackward<T>(const core::CudaExec&, T*, T*, float*, float*, float*,   \
                                          float*, const float*, const float*, int, const float*,   \
                                          int, const float*, const float*, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
