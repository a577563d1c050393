// MoE permute / combine kernels (see moe_cuda.h). Per-token sums use one block per token whose
// first thread orders the token's rows (at most kMoeMaxTopK) so every sum runs in row order;
// no atomics, so results are deterministic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "model/variants/moe_cuda.h"

namespace satdar::model::cuda {

namespace {

constexpr int kThreads = 128;

using namespace ::satdar::core::cuda::device;  // ToF, FromF, Ld, St, WarpSum (bf16.cuh)
using ::satdar::core::cuda::Launch;

__global__ void FillKernel(int* p, int64_t n, int value) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

__global__ void InvertKernel(int* row_of_slot, const int* slots, int rows) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) row_of_slot[slots[r]] = r;
}

template <typename T>
__global__ void PermuteKernel(T* xp, const T* x, const int* slots, int rows, int k, int d) {
  const int64_t total = static_cast<int64_t>(rows) * d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, c = e % d;
    xp[e] = x[static_cast<int64_t>(slots[r] / k) * d + c];
  }
}

// The token's dispatched (row, slot) pairs in increasing row order, into shared memory; returns
// their count. Called by every thread of the block.
__device__ int OrderRows(const int* row_of_slot, int tok, int k, int* rows_s, int* slot_s) {
  __shared__ int count;
  if (threadIdx.x == 0) {
    int cnt = 0;
    for (int j = 0; j < k; ++j) {
      const int slot = tok * k + j, r = row_of_slot[slot];
      if (r < 0) continue;
      int p = cnt++;
      while (p > 0 && rows_s[p - 1] > r) {  // insertion sort, k is small
        rows_s[p] = rows_s[p - 1];
        slot_s[p] = slot_s[p - 1];
        --p;
      }
      rows_s[p] = r;
      slot_s[p] = slot;
    }
    count = cnt;
  }
  __syncthreads();
  return count;
}

template <typename T>
__global__ void CombineKernel(T* out, const T* y, const float* weight, const int* row_of_slot,
                              int k, int d) {
  __shared__ int rows_s[kMoeMaxTopK], slot_s[kMoeMaxTopK];
  const int tok = blockIdx.x;
  const int cnt = OrderRows(row_of_slot, tok, k, rows_s, slot_s);
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < cnt; ++j) {
      acc += weight[slot_s[j]] * Ld(y + static_cast<int64_t>(rows_s[j]) * d + c);
    }
    St(out + static_cast<int64_t>(tok) * d + c, acc);
  }
}

template <typename T>
__global__ void PermuteBackwardKernel(T* dx, const T* dxp, const int* row_of_slot, int k, int d) {
  __shared__ int rows_s[kMoeMaxTopK], slot_s[kMoeMaxTopK];
  const int tok = blockIdx.x;
  const int cnt = OrderRows(row_of_slot, tok, k, rows_s, slot_s);
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < cnt; ++j) acc += Ld(dxp + static_cast<int64_t>(rows_s[j]) * d + c);
    T* o = dx + static_cast<int64_t>(tok) * d + c;
    St(o, Ld(o) + acc);
  }
}

// One block per row: dy[r] = w dout[tok], dweight[slot] = y[r] . dout[tok] (tree reduction).
template <typename T>
__global__ void CombineBackwardKernel(T* dy, float* dweight, const T* dout, const T* y,
                                      const float* weight, const int* slots, int k, int d) {
  __shared__ float part[kThreads];
  const int r = blockIdx.x, slot = slots[r], tok = slot / k;
  const float w = weight[slot];
  const T* g = dout + static_cast<int64_t>(tok) * d;
  const T* yr = y + static_cast<int64_t>(r) * d;
  float dot = 0.0f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    const float gc = Ld(g + c);
    St(dy + static_cast<int64_t>(r) * d + c, w * gc);
    dot += Ld(yr + c) * gc;
  }
  part[threadIdx.x] = dot;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) dweight[slot] = part[0];
}

absl::Status CheckArgs(core::DType dtype, int k) {
  if (dtype != core::DType::kF32 && dtype != core::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("MoE cuda: dtype ", core::DTypeName(dtype),
                                                   " not supported (f32, bf16)"));
  }
  if (k <= 0 || k > kMoeMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE cuda: top_k ", k, " outside [1, ", kMoeMaxTopK, "]"));
  }
  return absl::OkStatus();
}

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

absl::Status MoeInvertSlots(int* row_of_slot, const int* slots, int rows, int n, int k,
                            CUstream_st* stream) {
  const int64_t nk = static_cast<int64_t>(n) * k;
  if (nk > 0) {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("FillKernel", FillKernel, dim3(Blocks(nk)),
                                       dim3(kThreads), 0, stream, row_of_slot, nk, -1));
  }
  if (rows > 0) {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("InvertKernel", InvertKernel, dim3(Blocks(rows)),
                                       dim3(kThreads), 0, stream, row_of_slot, slots, rows));
  }
  return absl::OkStatus();
}

absl::Status MoePermute(core::DType dtype, void* xp, const void* x, const int* slots, int rows,
                        int k, int d, CUstream_st* stream) {
  absl::Status st = CheckArgs(dtype, k);
  if (!st.ok()) return st;
  const int64_t total = static_cast<int64_t>(rows) * d;
  if (total == 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(Blocks(total), 65535 * 8));
  if (dtype == core::DType::kBF16) {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("PermuteKernel", PermuteKernel<__nv_bfloat16>, dim3(blocks),
                                       dim3(kThreads), 0, stream,
                                       static_cast<__nv_bfloat16*>(xp),
                                       static_cast<const __nv_bfloat16*>(x), slots, rows, k, d));
  } else {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("PermuteKernel", PermuteKernel<float>, dim3(blocks),
                                       dim3(kThreads), 0, stream, static_cast<float*>(xp),
                                       static_cast<const float*>(x), slots, rows, k, d));
  }
  return absl::OkStatus();
}

absl::Status MoePermuteBackward(core::DType dtype, void* dx, const void* dxp,
                                const int* row_of_slot, int n, int k, int d,
                                CUstream_st* stream) {
  absl::Status st = CheckArgs(dtype, k);
  if (!st.ok()) return st;
  if (n == 0 || d == 0) return absl::OkStatus();
  if (dtype == core::DType::kBF16) {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("PermuteBackwardKernel",
                                       PermuteBackwardKernel<__nv_bfloat16>, dim3(n),
                                       dim3(kThreads), 0, stream, static_cast<__nv_bfloat16*>(dx),
                                       static_cast<const __nv_bfloat16*>(dxp), row_of_slot, k,
                                       d));
  } else {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("PermuteBackwardKernel", PermuteBackwardKernel<float>,
                                       dim3(n), dim3(kThreads), 0, stream,
                                       static_cast<float*>(dx), static_cast<const float*>(dxp),
                                       row_of_slot, k, d));
  }
  return absl::OkStatus();
}

absl::Status MoeCombine(core::DType dtype, void* out, const void* y, const float* weight,
                        const int* row_of_slot, int n, int k, int d, CUstream_st* stream) {
  absl::Status st = CheckArgs(dtype, k);
  if (!st.ok()) return st;
  if (n == 0 || d == 0) return absl::OkStatus();
  if (dtype == core::DType::kBF16) {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("CombineKernel", CombineKernel<__nv_bfloat16>, dim3(n),
                                       dim3(kThreads), 0, stream,
                                       static_cast<__nv_bfloat16*>(out),
                                       static_cast<const __nv_bfloat16*>(y), weight, row_of_slot,
                                       k, d));
  } else {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("CombineKernel", CombineKernel<float>, dim3(n),
                                       dim3(kThreads), 0, stream, static_cast<float*>(out),
                                       static_cast<const float*>(y), weight, row_of_slot, k, d));
  }
  return absl::OkStatus();
}

absl::Status MoeCombineBackward(core::DType dtype, void* dy, float* dweight, const void* dout,
                                const void* y, const float* weight, const int* slots, int rows,
                                int k, int d, CUstream_st* stream) {
  absl::Status st = CheckArgs(dtype, k);
  if (!st.ok()) return st;
  if (rows == 0) return absl::OkStatus();
  if (dtype == core::DType::kBF16) {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch(
        "CombineBackwardKernel", CombineBackwardKernel<__nv_bfloat16>, dim3(rows), dim3(kThreads),
        0, stream, static_cast<__nv_bfloat16*>(dy), dweight,
        static_cast<const __nv_bfloat16*>(dout), static_cast<const __nv_bfloat16*>(y), weight,
        slots, k, d));
  } else {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch(
        "CombineBackwardKernel", CombineBackwardKernel<float>, dim3(rows), dim3(kThreads), 0,
        stream, static_cast<float*>(dy), dweight, static_cast<const float*>(dout),
        static_cast<const float*>(y), weight, slots, k, d));
  }
  return absl::OkStatus();
}

}  // namespace satdar::model::cuda
