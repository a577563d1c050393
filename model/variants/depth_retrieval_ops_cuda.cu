// AttnRes's and DAR's depth retrieval on the GPU (depth_retrieval_ops.h;
// depth_retrieval_ops_cpu.cc is the reference). One block per token: each warp takes sources
// i = warp, warp + warps, ... and reduces its per-source dot products over C with shuffles;
// thread 0 does the softmax over the S sources; then every thread handles its columns for all
// sources in source order. In the backward the per-token kernel also stores a_i = dz_i * rstd_i
// (the factor of x_i in d/dw and d/dg) in the workspace, and a column-tiled kernel sums a_i x_i
// over tokens and sources in a fixed order. The Dual ops are two calls of the single ones.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/cuda/bf16.cuh"
#include "core/check.h"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "model/variants/depth_retrieval_ops.h"
#include "core/cuda/workspace.h"

namespace satdar::model::cuda {

namespace {
constexpr int kRowThreads = 256;  // the most threads per row block (a multiple of 32)
constexpr int kTileCols = 32;
constexpr int kTileRows = 8;

using namespace ::satdar::core::cuda::device;  // NOLINT: ToF, FromF, WarpSum (bf16.cuh)
using ::satdar::core::cuda::Launch;

// Dynamic shared memory: s floats (logits, then weights).
template <typename T>
__global__ void ForwardKernel(T* out, float* alpha, const T* const* keys, const T* const* values,
                              int s, const T* w, const T* g, int c, float eps) {
  SATDAR_DYNAMIC_SHARED(float, a);
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int i = warp; i < s; i += warps) {
    const T* x = keys[i] + r * c;
    float ss = 0.0f, z = 0.0f;
    for (int e = lane; e < c; e += 32) {
      const float xe = ToF(x[e]);
      ss += xe * xe;
      z += ToF(w[e]) * ToF(g[e]) * xe;
    }
    ss = WarpSum(ss);
    z = WarpSum(z);
    if (lane == 0) a[i] = z / sqrtf(ss / c + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = a[0];
    for (int i = 1; i < s; ++i) mx = a[i] > mx ? a[i] : mx;
    float sum = 0.0f;
    for (int i = 0; i < s; ++i) sum += a[i] = expf(a[i] - mx);
    for (int i = 0; i < s; ++i) {
      a[i] /= sum;
      alpha[r * s + i] = a[i];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < c; e += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < s; ++i) o += a[i] * ToF(values[i][r * c + e]);
    out[r * c + e] = FromF<T>(o);
  }
}

// Dynamic shared memory: 4 s floats: da (then dz), rstd, q = wg . x, and the factor a_i.
template <typename T>
__global__ void BackwardRowKernel(T* const* dkeys, T* const* dvalues, float* workspace,
                                  const T* dout, const float* alpha, const T* const* keys,
                                  const T* const* values, int s, const T* w, const T* g, int c,
                                  float eps) {
  SATDAR_DYNAMIC_SHARED(float, sh);
  float* dz = sh;
  float* rs = sh + s;
  float* q = sh + 2 * s;
  float* ar = sh + 3 * s;
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const T* d = dout + r * c;
  for (int i = warp; i < s; i += warps) {
    const T* v = values[i] + r * c;
    const T* x = keys[i] + r * c;
    float da = 0.0f, ss = 0.0f, qi = 0.0f;
    for (int e = lane; e < c; e += 32) {
      const float xe = ToF(x[e]);
      da += ToF(v[e]) * ToF(d[e]);
      ss += xe * xe;
      qi += ToF(w[e]) * ToF(g[e]) * xe;
    }
    da = WarpSum(da);
    ss = WarpSum(ss);
    qi = WarpSum(qi);
    if (lane == 0) {
      dz[i] = da;
      rs[i] = 1.0f / sqrtf(ss / c + eps);
      q[i] = qi;
    }
  }
  __syncthreads();
  const float* al = alpha + r * s;
  if (threadIdx.x == 0) {
    float dot = 0.0f;
    for (int i = 0; i < s; ++i) dot += al[i] * dz[i];
    for (int i = 0; i < s; ++i) {
      dz[i] = al[i] * (dz[i] - dot);  // softmax backward
      ar[i] = dz[i] * rs[i];
      workspace[r * s + i] = ar[i];
    }
  }
  __syncthreads();
  // Each thread updates its own columns of every source in order, so dkeys[i] may alias
  // dvalues[i] (or any other entry).
  for (int e = threadIdx.x; e < c; e += blockDim.x) {
    const float de = ToF(d[e]);
    const float wge = ToF(w[e]) * ToF(g[e]);
    for (int i = 0; i < s; ++i) {
      if (dvalues[i] != nullptr) {
        T* dv = dvalues[i] + r * c;
        dv[e] = FromF<T>(ToF(dv[e]) + al[i] * de);
      }
      if (dkeys[i] != nullptr) {
        // d/dx of rstd * (wg . x): rstd * wg - rstd^3 (wg . x) x / C, times dz.
        T* dk = dkeys[i] + r * c;
        const float coef = dz[i] * q[i] * rs[i] * rs[i] * rs[i] / c;
        dk[e] = FromF<T>(ToF(dk[e]) + ar[i] * wge - coef * ToF(keys[i][r * c + e]));
      }
    }
  }
}

// sum_{r,i} a[r,i] keys_i[r,e], then dw += g * sum and dg += w * sum. Block (kTileCols,
// kTileRows) owns kTileCols columns; row lane ty sums rows ty, ty + kTileRows, ...; the lanes
// are added in order.
template <typename T>
__global__ void BackwardWeightKernel(float* dw, float* dg, const float* workspace,
                                     const T* const* keys, int s, const T* w, const T* g, int n,
                                     int c) {
  __shared__ float part[kTileRows][kTileCols + 1];
  const int e = blockIdx.x * kTileCols + threadIdx.x;
  float acc = 0.0f;
  if (e < c) {
    for (int64_t r = threadIdx.y; r < n; r += kTileRows) {
      for (int i = 0; i < s; ++i) acc += workspace[r * s + i] * ToF(keys[i][r * c + e]);
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && e < c) {
    float sum = 0.0f;
    for (int k = 0; k < kTileRows; ++k) sum += part[k][threadIdx.x];
    if (dw != nullptr) dw[e] += ToF(g[e]) * sum;
    if (dg != nullptr) dg[e] += ToF(w[e]) * sum;
  }
}

// Threads per row block: a warp per source and a thread per column, at most kRowThreads (no
// idle warps on a narrow row). The results do not depend on it: each source's sums run over
// its warp's lanes in a fixed pattern, and each column is one thread's.
unsigned RowThreads(int s, int c) {
  const int warps = s > (c + 31) / 32 ? s : (c + 31) / 32;
  return static_cast<unsigned>(warps * 32 < kRowThreads ? warps * 32 : kRowThreads);
}
}  // namespace

template <typename T>
absl::Status DepthRetrievalForward(const core::CudaExec& x, T* out, float* alpha,
                                   const T* const* keys, const T* const* values, int sources,
                                   const T* w, const T* g, int n, int c, float eps) {
  cudaStream_t stream = x.stream;
  const int s = sources;
  if (n <= 0 || c <= 0 || s <= 0) return absl::OkStatus();
  const size_t smem = static_cast<size_t>(s) * sizeof(float);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthRetrievalForwardKernel", ForwardKernel<T>, dim3(n),
                                     dim3(RowThreads(s, c)), smem, stream, out, alpha, keys,
                                     values, s, w, g, c, eps));
  return absl::OkStatus();
}

template <typename T>
absl::Status DepthRetrievalBackward(const core::CudaExec& x, T* const* dkeys,
                                    T* const* dvalues, float* dw, float* dg, const T* dout,
                                    const float* alpha, const T* const* keys,
                                    const T* const* values, int sources, const T* w, const T* g,
                                    int n, int c, float eps) {
  cudaStream_t stream = x.stream;
  const int s = sources;
  if (n <= 0 || c <= 0 || s <= 0) return absl::OkStatus();
  SATDAR_ASSIGN_OR_RETURN(
      float* workspace,
      core::cuda::Scratch<float>(x, static_cast<size_t>(n) * s, "DepthRetrievalBackward"));
  const size_t smem = 4 * static_cast<size_t>(s) * sizeof(float);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthRetrievalBackwardRowKernel", BackwardRowKernel<T>,
                                     dim3(n), dim3(RowThreads(s, c)), smem, stream, dkeys,
                                     dvalues, workspace, dout, alpha, keys, values, s, w, g, c,
                                     eps));
  if (dw == nullptr && dg == nullptr) return absl::OkStatus();
  const unsigned tiles = static_cast<unsigned>((c + kTileCols - 1) / kTileCols);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthRetrievalBackwardWeightKernel",
                                     BackwardWeightKernel<T>, dim3(tiles),
                                     dim3(kTileCols, kTileRows), 0, stream, dw, dg, workspace,
                                     keys, s, w, g, n, c));
  return absl::OkStatus();
}

template <typename T>
absl::Status DualDepthRetrievalForward(const core::CudaExec& x, T* const out[2],
                                       float* const alpha[2], const DualRetrieval<T>& r, int n,
                                       int c, float eps) {
  for (int t = 0; t < 2; ++t) {
    absl::Status status =
        DepthRetrievalForward(x, out[t], alpha[t], r.streams[r.key[t]], r.streams[r.value[t]],
                              r.sources, r.w[t], r.g, n, c, eps);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// Target 1's call adds to the gradients target 0's wrote (dstreams, dg), in stream order.
template <typename T>
absl::Status DualDepthRetrievalBackward(const core::CudaExec& x, T* const* const dstreams[2],
                                        float* const dw[2], float* dg, const T* const dout[2],
                                        const float* const alpha[2], const DualRetrieval<T>& r,
                                        int n, int c, float eps) {
  for (int t = 0; t < 2; ++t) {
    absl::Status status = DepthRetrievalBackward(
        x, dstreams[r.key[t]], dstreams[r.value[t]], dw[t], dg, dout[t], alpha[t],
        r.streams[r.key[t]], r.streams[r.value[t]], r.sources, r.w[t], r.g, n, c, eps);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template absl::Status DepthRetrievalForward<T>(const core::CudaExec&, T*, float*,                \
                                                 const T* const*, const T* const*, int, const T*,  \
                                                 const T*, int, int, float);                       \
  template absl::Status DepthRetrievalBackward<T>(                                                 \
      const core::CudaExec&, T* const*, T* const*, float*, float*, const T*, const float*,         \
      const T* const*, const T* const*, int, const T*, const T*, int, int, float);                 \
  template absl::Status DualDepthRetrievalForward<T>(const core::CudaExec&, T* const[2],           \
                                                     float* const[2], const DualRetrieval<T>&,     \
                                                     int, int, float);                             \
  template absl::Status DualDepthRetrievalBackward<T>(                                             \
      const core::CudaExec&, T* const* const[2], float* const[2], float*, const T* const[2],       \
      const float* const[2], const DualRetrieval<T>&, int, int, float);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
