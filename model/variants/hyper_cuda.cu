// CUDA kernels of HC and mHC (hyper_cuda.h; mHC's coefficients: hyper_ops_cuda.cu). Elementwise
// kernels walk (token, stream, channel) with a grid stride; per-token dot products run one
// block per token (or token and stream), each thread a fixed channel slice, then a
// shared-memory tree in a fixed order.
#include "model/variants/hyper_cuda.h"

#include "core/cuda/bf16.cuh"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;
constexpr int kS = kMaxHyperStreams;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

__device__ __forceinline__ float Pre(const HyperCoefs& c, int64_t r, int j) {
  return c.pre[r * c.pre_token + j * c.pre_step];
}
__device__ __forceinline__ float Post(const HyperCoefs& c, int64_t r, int m) {
  return c.post[r * c.post_token + m];
}
__device__ __forceinline__ float Res(const HyperCoefs& c, int64_t r, int j, int m) {
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

template <typename T>
__global__ void WidthKernel(T* u, const T* h, HyperCoefs coefs, int64_t rows, int n, int c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * c;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, e = i % c;
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += Pre(coefs, r, j) * Ld(h + (r * n + j) * c + e);
    St(u + i, s);
  }
}

template <typename T>
__global__ void DepthKernel(T* h_out, const T* h, const T* y, HyperCoefs coefs, int64_t rows,
                            int n, int c) {
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
__global__ void DepthBackwardKernel(T* dy, T* dh, const T* g, HyperCoefs coefs, int64_t rows,
                                    int n, int c) {
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
__global__ void DepthDotsKernel(HyperCoefs dcoefs, const T* g, const T* y, const T* h, int n,
                                int c) {
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
__global__ void WidthBackwardKernel(T* dh, const T* du, HyperCoefs coefs, int64_t rows, int n,
                                    int c) {
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
__global__ void WidthDotsKernel(HyperCoefs dcoefs, const T* du, const T* h, int n, int c) {
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
  for (int r = threadIdx.x; r < rows; r += blockDim.x) acc[0] += in[static_cast<int64_t>(r) * ld + k];
  BlockSums<kThreads, 1>(acc);
  if (threadIdx.x == 0) out[k] += acc[0];
}

// Thread per token.
__global__ void HcCoefForwardKernel(float* coef, float* proj, int ld, HcParams p, int rows,
                                    int n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float sa = *p.alpha_scale, sb = *p.beta_scale;
  float* out = coef + r * n * (n + 2);
  for (int j = 0; j < n; ++j) {
    float* z = proj + (r * n + j) * ld;
    for (int k = 0; k <= n; ++k) {
      const float t = tanhf(z[k]);
      z[k] = t;
      out[j * (n + 1) + k] = p.static_alpha[j * (n + 1) + k] + sa * t;
    }
    const float t = tanhf(z[n + 1]);
    z[n + 1] = t;
    out[n * (n + 1) + j] = p.static_beta[j] + sb * t;
  }
}

template <typename T>
__global__ void HcCoefBackwardKernel(T* dproj, float* scales, const float* dcoef,
                                     const float* tanh_proj, int ld, HcParams p, int rows, int n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float sa = *p.alpha_scale, sb = *p.beta_scale;
  const float* dc = dcoef + r * n * (n + 2);
  float dsa = 0.0f, dsb = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float* t = tanh_proj + (r * n + j) * ld;
    T* out = dproj + (r * n + j) * ld;
    for (int k = 0; k <= n; ++k) {
      const float da = dc[j * (n + 1) + k];
      dsa += da * t[k];
      St(out + k, da * sa * (1.0f - t[k] * t[k]));
    }
    const float db = dc[n * (n + 1) + j];
    dsb += db * t[n + 1];
    St(out + n + 1, db * sb * (1.0f - t[n + 1] * t[n + 1]));
    for (int k = n + 2; k < ld; ++k) St(out + k, 0.0f);
  }
  scales[2 * r] = dsa;
  scales[2 * r + 1] = dsb;
}

bool BadStreams(int n) { return n < 1 || n > kMaxHyperStreams; }

}  // namespace

HyperCoefs HcCoefs(float* coef, int n) {
  HyperCoefs c;
  c.pre = coef;
  c.pre_token = n * (n + 2);
  c.pre_step = n + 1;
  c.res = coef + 1;
  c.res_token = n * (n + 2);
  c.res_row = n + 1;
  c.post = coef + n * (n + 1);
  c.post_token = n * (n + 2);
  return c;
}

template <typename T>
cudaError_t StreamsBroadcast(T* out, const T* in, int rows, int n, int c, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return Launch("BroadcastKernel", BroadcastKernel<T>,
                dim3(Blocks(static_cast<int64_t>(rows) * n * c)), dim3(kThreads), 0, stream, out,
                in, rows, n, c);
}

template <typename T>
cudaError_t StreamsSum(T* out, const T* in, int rows, int n, int c, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return Launch("SumKernel", SumKernel<T>, dim3(Blocks(static_cast<int64_t>(rows) * c)),
                dim3(kThreads), 0, stream, out, in, rows, n, c);
}

template <typename T>
cudaError_t HyperWidthForward(T* u, const T* h, const HyperCoefs& coefs, int rows, int n, int c,
                              cudaStream_t stream) {
  if (BadStreams(n)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return Launch("WidthKernel", WidthKernel<T>, dim3(Blocks(static_cast<int64_t>(rows) * c)),
                dim3(kThreads), 0, stream, u, h, coefs, rows, n, c);
}

template <typename T>
cudaError_t HyperDepthForward(T* h_out, const T* h, const T* y, const HyperCoefs& coefs,
                              int rows, int n, int c, cudaStream_t stream) {
  if (BadStreams(n)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return Launch("DepthKernel", DepthKernel<T>, dim3(Blocks(static_cast<int64_t>(rows) * n * c)),
                dim3(kThreads), 0, stream, h_out, h, y, coefs, rows, n, c);
}

template <typename T>
cudaError_t HyperDepthBackward(T* dy, T* dh, const HyperCoefs& dcoefs, const T* g, const T* y,
                               const T* h, const HyperCoefs& coefs, int rows, int n, int c,
                               cudaStream_t stream) {
  if (BadStreams(n)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (cudaError_t e = Launch("DepthBackwardKernel", DepthBackwardKernel<T>,
                             dim3(Blocks(static_cast<int64_t>(rows) * c)), dim3(kThreads), 0,
                             stream, dy, dh, g, coefs, rows, n, c);
      e != cudaSuccess) {
    return e;
  }
  return Launch("DepthDotsKernel", DepthDotsKernel<T>, dim3(rows, n), dim3(kThreads), 0, stream,
                dcoefs, g, y, h, n, c);
}

template <typename T>
cudaError_t HyperWidthBackward(T* dh, const HyperCoefs& dcoefs, const T* du, const T* h,
                               const HyperCoefs& coefs, int rows, int n, int c,
                               cudaStream_t stream) {
  if (BadStreams(n)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  // The dots read h and du only, so they may run before dh changes.
  if (cudaError_t e = Launch("WidthDotsKernel", WidthDotsKernel<T>, dim3(rows), dim3(kThreads), 0,
                             stream, dcoefs, du, h, n, c);
      e != cudaSuccess) {
    return e;
  }
  return Launch("WidthBackwardKernel", WidthBackwardKernel<T>,
                dim3(Blocks(static_cast<int64_t>(rows) * n * c)), dim3(kThreads), 0, stream, dh,
                du, coefs, rows, n, c);
}

cudaError_t ColumnSums(float* out, const float* in, int rows, int cols, int ld,
                       cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  return Launch("ColumnSumsKernel", ColumnSumsKernel, dim3(cols), dim3(kThreads), 0, stream, out,
                in, rows, ld);
}

cudaError_t HcCoefForward(float* coef, float* proj, int ld, const HcParams& p, int rows, int n,
                          cudaStream_t stream) {
  if (BadStreams(n) || ld < n + 2) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return Launch("HcCoefForwardKernel", HcCoefForwardKernel, dim3((rows + 127) / 128), dim3(128),
                0, stream, coef, proj, ld, p, rows, n);
}

template <typename T>
cudaError_t HcCoefBackward(T* dproj, float* scales, const float* dcoef, const float* tanh_proj,
                           int ld, const HcParams& p, int rows, int n, cudaStream_t stream) {
  if (BadStreams(n) || ld < n + 2) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return Launch("HcCoefBackwardKernel", HcCoefBackwardKernel<T>, dim3((rows + 127) / 128),
                dim3(128), 0, stream, dproj, scales, dcoef, tanh_proj, ld, p, rows, n);
}

#define SATDAR_INSTANTIATE(T)                                                                   \
  template cudaError_t StreamsBroadcast<T>(T*, const T*, int, int, int, cudaStream_t);          \
  template cudaError_t StreamsSum<T>(T*, const T*, int, int, int, cudaStream_t);                \
  template cudaError_t HyperWidthForward<T>(T*, const T*, const HyperCoefs&, int, int, int,     \
                                            cudaStream_t);                                      \
  template cudaError_t HyperDepthForward<T>(T*, const T*, const T*, const HyperCoefs&, int, int, \
                                            int, cudaStream_t);                                 \
  template cudaError_t HyperDepthBackward<T>(T*, T*, const HyperCoefs&, const T*, const T*,     \
                                             const T*, const HyperCoefs&, int, int, int,        \
                                             cudaStream_t);                                     \
  template cudaError_t HyperWidthBackward<T>(T*, const HyperCoefs&, const T*, const T*,         \
                                             const HyperCoefs&, int, int, int, cudaStream_t);   \
  template cudaError_t HcCoefBackward<T>(T*, float*, const float*, const float*, int,           \
                                         const HcParams&, int, int, cudaStream_t);

SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
