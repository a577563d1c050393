// Flash-style causal GQA attention. One thread owns one query row (forward, dq) or one key row
// (dk/dv) and keeps its vectors in registers; blocks of TILE threads stream TILE rows of the
// other operand through shared memory. The forward keeps a running max and sum per row (online
// softmax) and saves lse = max + log(sum); the backward recomputes p = exp(s - lse).
//
//   forward:  grid (B*NH, T/TILE)   thread = query i: m, l, acc over key tiles j0 <= i
//   delta:    delta_i = dout_i . out_i                    (= rowsum(P * dP) of the CPU path)
//   dk/dv:    grid (B*NKV, T/TILE)  thread = key j: loops over the group's query heads and the
//             query tiles i >= j: dv_j += p dout_i, dk_j += scale p (dout_i.v_j - delta_i) q_i
//   dq:       grid (B*NH, T/TILE)   thread = query i: dq_i += scale p (dout_i.v_j - delta_i) k_j
//
// Query tiles are issued from the last (the longest causal rows) to the first.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/workspace.h"
#include "core/ops/attention_cuda.h"

namespace satdar::core::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // ToF, FromF, Ld, St, WarpSum (bf16.cuh)

// Loads rows [r0, r0 + TILE) of a (T, stride) matrix's `hs` columns at `base` into s (zero
// outside), all TILE threads of the block taking part.
template <typename T, int HSM, int TILE>
__device__ __forceinline__ void LoadTile(float (*s)[HSM], const T* base, int r0, int t,
                                         int stride, int hs) {
  for (int e = threadIdx.x; e < TILE * HSM; e += TILE) {
    const int r = e / HSM, d = e % HSM, row = r0 + r;
    s[r][d] = (row < t && d < hs) ? Ld(base + static_cast<int64_t>(row) * stride + d) : 0.0f;
  }
}

// tq query rows per sequence at positions past..past+tq-1, reading keys [0, past+i] of k and v
// (kv_rows rows per sequence). Training passes (t, 0, t); a KV-cache step (tn, past, cap)
// runs the same arithmetic over the cached rows. lse may be null (not written).
template <typename T, int HSM, int TILE>
__global__ void __launch_bounds__(TILE) ForwardKernel(T* out, float* lse, const T* q, const T* k,
                                                      const T* v, int tq, int past, int kv_rows,
                                                      int nh, int nkv, int hs, float scale) {
  __shared__ float ks[TILE][HSM];
  __shared__ float vs[TILE][HSM];
  const int bh = blockIdx.x, bi = bh / nh, h = bh % nh, g = h / (nh / nkv);
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int i = tile * TILE + threadIdx.x;
  const bool active = i < tq;
  const int qs = nh * hs, kvs = nkv * hs;
  const int keys = past + tq;  // key rows any query of this launch reads
  const T* qp = q + (static_cast<int64_t>(bi) * tq + i) * qs + h * hs;
  const T* kb = k + static_cast<int64_t>(bi) * kv_rows * kvs + g * hs;
  const T* vb = v + static_cast<int64_t>(bi) * kv_rows * kvs + g * hs;
  float qr[HSM], acc[HSM];
#pragma unroll
  for (int d = 0; d < HSM; ++d) {
    qr[d] = (active && d < hs) ? Ld(qp + d) * scale : 0.0f;
    acc[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last = min(keys, past + (tile + 1) * TILE);
  for (int j0 = 0; j0 < last; j0 += TILE) {
    LoadTile<T, HSM, TILE>(ks, kb, j0, keys, kvs, hs);
    LoadTile<T, HSM, TILE>(vs, vb, j0, keys, kvs, hs);
    __syncthreads();
    if (active) {
      const int jn = min(TILE, past + i - j0 + 1);
      for (int r = 0; r < jn; ++r) {
        float s = 0.0f;
#pragma unroll
        for (int d = 0; d < HSM; ++d) s += qr[d] * ks[r][d];
        if (s > m) {
          const float c = expf(m - s);
          l *= c;
#pragma unroll
          for (int d = 0; d < HSM; ++d) acc[d] *= c;
          m = s;
        }
        const float p = expf(s - m);
        l += p;
#pragma unroll
        for (int d = 0; d < HSM; ++d) acc[d] += p * vs[r][d];
      }
    }
    __syncthreads();
  }
  if (!active) return;
  const float inv = 1.0f / l;
  T* op = out + (static_cast<int64_t>(bi) * tq + i) * qs + h * hs;
#pragma unroll
  for (int d = 0; d < HSM; ++d) {
    if (d < hs) St(op + d, acc[d] * inv);
  }
  if (lse != nullptr) lse[static_cast<int64_t>(bh) * tq + i] = m + logf(l);
}

// delta (B,NH,T) = rowsum(dout * out), one thread per row.
template <typename T>
__global__ void DeltaKernel(float* delta, const T* dout, const T* out, int b, int t, int nh,
                            int hs) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= static_cast<int64_t>(b) * nh * t) return;
  const int i = static_cast<int>(row % t);
  const int64_t bh = row / t;
  const int bi = static_cast<int>(bh / nh), h = static_cast<int>(bh % nh);
  const int64_t off = (static_cast<int64_t>(bi) * t + i) * nh * hs + h * hs;
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += Ld(dout + off + d) * Ld(out + off + d);
  delta[row] = s;
}

template <typename T, int HSM, int TILE>
__global__ void __launch_bounds__(TILE) DkDvKernel(T* dk, T* dv, const T* dout, const float* lse,
                                                   const float* delta, const T* q, const T* k,
                                                   const T* v, int t, int nh, int nkv, int hs,
                                                   float scale) {
  __shared__ float qs_[TILE][HSM];
  __shared__ float dos[TILE][HSM];
  __shared__ float lse_s[TILE];
  __shared__ float del_s[TILE];
  const int bg = blockIdx.x, bi = bg / nkv, g = bg % nkv, group = nh / nkv;
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int j = tile * TILE + threadIdx.x;
  const bool active = j < t;
  const int qstride = nh * hs, kvs = nkv * hs;
  const int64_t kv_off = (static_cast<int64_t>(bi) * t + j) * kvs + g * hs;
  float kr[HSM], vr[HSM], dkr[HSM], dvr[HSM];
#pragma unroll
  for (int d = 0; d < HSM; ++d) {
    kr[d] = (active && d < hs) ? Ld(k + kv_off + d) : 0.0f;
    vr[d] = (active && d < hs) ? Ld(v + kv_off + d) : 0.0f;
    dkr[d] = 0.0f;
    dvr[d] = 0.0f;
  }
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const int64_t bh = static_cast<int64_t>(bi) * nh + h;
    const T* qb = q + static_cast<int64_t>(bi) * t * qstride + h * hs;
    const T* db = dout + static_cast<int64_t>(bi) * t * qstride + h * hs;
    for (int i0 = tile * TILE; i0 < t; i0 += TILE) {
      LoadTile<T, HSM, TILE>(qs_, qb, i0, t, qstride, hs);
      LoadTile<T, HSM, TILE>(dos, db, i0, t, qstride, hs);
      const int ii = i0 + threadIdx.x;
      lse_s[threadIdx.x] = ii < t ? lse[bh * t + ii] : 0.0f;
      del_s[threadIdx.x] = ii < t ? delta[bh * t + ii] : 0.0f;
      __syncthreads();
      if (active) {
        const int rn = min(TILE, t - i0);
        for (int r = max(0, j - i0); r < rn; ++r) {  // queries i = i0 + r >= j
          float s = 0.0f, dp = 0.0f;
#pragma unroll
          for (int d = 0; d < HSM; ++d) {
            s += qs_[r][d] * kr[d];
            dp += dos[r][d] * vr[d];
          }
          const float p = expf(s * scale - lse_s[r]);
          const float ds = scale * p * (dp - del_s[r]);
#pragma unroll
          for (int d = 0; d < HSM; ++d) {
            dvr[d] += p * dos[r][d];
            dkr[d] += ds * qs_[r][d];
          }
        }
      }
      __syncthreads();
    }
  }
  if (!active) return;
#pragma unroll
  for (int d = 0; d < HSM; ++d) {
    if (d < hs) {
      St(dk + kv_off + d, Ld(dk + kv_off + d) + dkr[d]);
      St(dv + kv_off + d, Ld(dv + kv_off + d) + dvr[d]);
    }
  }
}

template <typename T, int HSM, int TILE>
__global__ void __launch_bounds__(TILE) DqKernel(T* dq, const T* dout, const float* lse,
                                                 const float* delta, const T* q, const T* k,
                                                 const T* v, int t, int nh, int nkv, int hs,
                                                 float scale) {
  __shared__ float ks[TILE][HSM];
  __shared__ float vs[TILE][HSM];
  const int bh = blockIdx.x, bi = bh / nh, h = bh % nh, g = h / (nh / nkv);
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int i = tile * TILE + threadIdx.x;
  const bool active = i < t;
  const int qstride = nh * hs, kvs = nkv * hs;
  const int64_t q_off = (static_cast<int64_t>(bi) * t + i) * qstride + h * hs;
  const T* kb = k + static_cast<int64_t>(bi) * t * kvs + g * hs;
  const T* vb = v + static_cast<int64_t>(bi) * t * kvs + g * hs;
  float qr[HSM], dor[HSM], dqr[HSM];
#pragma unroll
  for (int d = 0; d < HSM; ++d) {
    qr[d] = (active && d < hs) ? Ld(q + q_off + d) : 0.0f;
    dor[d] = (active && d < hs) ? Ld(dout + q_off + d) : 0.0f;
    dqr[d] = 0.0f;
  }
  const float li = active ? lse[static_cast<int64_t>(bh) * t + i] : 0.0f;
  const float di = active ? delta[static_cast<int64_t>(bh) * t + i] : 0.0f;
  const int last = min(t, (tile + 1) * TILE);
  for (int j0 = 0; j0 < last; j0 += TILE) {
    LoadTile<T, HSM, TILE>(ks, kb, j0, t, kvs, hs);
    LoadTile<T, HSM, TILE>(vs, vb, j0, t, kvs, hs);
    __syncthreads();
    if (active) {
      const int jn = min(TILE, i - j0 + 1);
      for (int r = 0; r < jn; ++r) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < HSM; ++d) {
          s += qr[d] * ks[r][d];
          dp += dor[d] * vs[r][d];
        }
        const float ds = scale * expf(s * scale - li) * (dp - di);
#pragma unroll
        for (int d = 0; d < HSM; ++d) dqr[d] += ds * ks[r][d];
      }
    }
    __syncthreads();
  }
  if (!active) return;
#pragma unroll
  for (int d = 0; d < HSM; ++d) {
    if (d < hs) St(dq + q_off + d, Ld(dq + q_off + d) + dqr[d]);
  }
}

absl::Status CheckShape(DType dtype, int b, int t, int nh, int nkv, int hs) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda attention: dtype ", DTypeName(dtype), " not supported (f32, bf16)"));
  }
  if (b < 0 || t < 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0 || hs <= 0 ||
      hs > kAttentionMaxHeadSize) {
    return absl::InvalidArgumentError(absl::StrCat("cuda attention: bad shape b=", b, " t=", t,
                                                   " nh=", nh, " nkv=", nkv, " hs=", hs,
                                                   " (nh % nkv == 0, 0 < hs <= 128)"));
  }
  return absl::OkStatus();
}

// tq query rows after `past` cached ones, over kv_rows rows of k and v per sequence (training:
// tq = kv_rows = t, past = 0).
template <typename T, int HSM, int TILE>
cudaError_t LaunchForward(void* out, float* lse, const void* q, const void* k, const void* v,
                          int b, int tq, int past, int kv_rows, int nh, int nkv, int hs,
                          float scale, cudaStream_t stream) {
  dim3 grid(b * nh, (tq + TILE - 1) / TILE);
  return Launch("AttentionForwardKernel", ForwardKernel<T, HSM, TILE>, LaunchBounds{TILE}, grid,
                dim3(TILE), 0, stream, static_cast<T*>(out), lse, static_cast<const T*>(q),
                static_cast<const T*>(k), static_cast<const T*>(v), tq, past, kv_rows, nh, nkv,
                hs, scale);
}

// The first launch that fails stops the sequence; its error is returned.
template <typename T, int HSM, int TILE>
cudaError_t LaunchBackward(void* dq, void* dk, void* dv, const void* dout, const void* out,
                           const float* lse, const void* q, const void* k, const void* v,
                           float* delta, int b, int t, int nh, int nkv, int hs, float scale,
                           cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(b) * nh * t;
  if (cudaError_t e = Launch("DeltaKernel", DeltaKernel<T>,
                             dim3(static_cast<unsigned>((rows + 255) / 256)), dim3(256), 0,
                             stream, delta, static_cast<const T*>(dout),
                             static_cast<const T*>(out), b, t, nh, hs);
      e != cudaSuccess) {
    return e;
  }
  const int tiles = (t + TILE - 1) / TILE;
  if (cudaError_t e = Launch("DkDvKernel", DkDvKernel<T, HSM, TILE>, LaunchBounds{TILE},
                             dim3(b * nkv, tiles), dim3(TILE), 0, stream, static_cast<T*>(dk),
                             static_cast<T*>(dv), static_cast<const T*>(dout), lse, delta,
                             static_cast<const T*>(q), static_cast<const T*>(k),
                             static_cast<const T*>(v), t, nh, nkv, hs, scale);
      e != cudaSuccess) {
    return e;
  }
  return Launch("DqKernel", DqKernel<T, HSM, TILE>, LaunchBounds{TILE}, dim3(b * nh, tiles),
                dim3(TILE), 0, stream, static_cast<T*>(dq), static_cast<const T*>(dout), lse,
                delta, static_cast<const T*>(q), static_cast<const T*>(k),
                static_cast<const T*>(v), t, nh, nkv, hs, scale);
}

// Calls F<T, HSM, TILE> for the dtype and the smallest head-size bucket holding hs; returns
// its launch error.
template <template <typename, int, int> class F, typename... Args>
cudaError_t Dispatch(DType dtype, int hs, Args... args) {
  const bool bf = dtype == DType::kBF16;
  if (hs <= 32) {
    return bf ? F<__nv_bfloat16, 32, 64>::Run(args...) : F<float, 32, 64>::Run(args...);
  } else if (hs <= 64) {
    return bf ? F<__nv_bfloat16, 64, 64>::Run(args...) : F<float, 64, 64>::Run(args...);
  } else {
    return bf ? F<__nv_bfloat16, 128, 32>::Run(args...) : F<float, 128, 32>::Run(args...);
  }
}

template <typename T, int HSM, int TILE>
struct Fwd {
  template <typename... Args>
  static cudaError_t Run(Args... args) { return LaunchForward<T, HSM, TILE>(args...); }
};
template <typename T, int HSM, int TILE>
struct Bwd {
  template <typename... Args>
  static cudaError_t Run(Args... args) { return LaunchBackward<T, HSM, TILE>(args...); }
};

}  // namespace

absl::Status AttentionForward(const CudaExec& x, DType dtype, void* out, float* lse, const void* q,
                              const void* k, const void* v, int b, int t, int nh, int nkv, int hs) {
  absl::Status st = CheckShape(dtype, b, t, nh, nkv, hs);
  if (!st.ok()) return st;
  if (b == 0 || t == 0) return absl::OkStatus();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  SATDAR_CUDA_RETURN_IF_ERROR(Dispatch<Fwd>(dtype, hs, out, lse, q, k, v, b, t, /*past=*/0,
                                            /*kv_rows=*/t, nh, nkv, hs, scale,
                                            static_cast<cudaStream_t>(x.stream)));
  return absl::OkStatus();
}

absl::Status AttentionCachedForward(const CudaExec& x, DType dtype, void* out, float* lse,
                                    const void* q, const void* k, const void* v, int b, int tn,
                                    int past, int cap, int nh, int nkv, int hs) {
  absl::Status st = CheckShape(dtype, b, tn, nh, nkv, hs);
  if (!st.ok()) return st;
  if (past < 0 || past + tn > cap) {
    return absl::InvalidArgumentError(absl::StrCat("cuda cached attention: positions [", past,
                                                   ", ", past + tn, ") outside the cache of ",
                                                   cap));
  }
  if (b == 0 || tn == 0) return absl::OkStatus();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  SATDAR_CUDA_RETURN_IF_ERROR(Dispatch<Fwd>(dtype, hs, out, lse, q, k, v, b, tn, past, cap, nh,
                                            nkv, hs, scale,
                                            static_cast<cudaStream_t>(x.stream)));
  return absl::OkStatus();
}

absl::Status AttentionBackward(const CudaExec& x, DType dtype, void* dq, void* dk, void* dv,
                               const void* dout, const void* out, const float* lse, const void* q,
                               const void* k, const void* v, int b, int t, int nh, int nkv, int hs) {
  absl::Status st = CheckShape(dtype, b, t, nh, nkv, hs);
  if (!st.ok()) return st;
  if (b == 0 || t == 0) return absl::OkStatus();
  absl::StatusOr<float*> delta =
      Scratch<float>(x, static_cast<size_t>(b) * nh * t, "AttentionBackward");
  if (!delta.ok()) return delta.status();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  SATDAR_CUDA_RETURN_IF_ERROR(Dispatch<Bwd>(dtype, hs, dq, dk, dv, dout, out, lse, q, k, v,
                                            *delta, b, t, nh, nkv, hs, scale,
                                            static_cast<cudaStream_t>(x.stream)));
  return absl::OkStatus();
}

}  // namespace satdar::core::cuda
