// The MoE FFN's router, plan, permute and combine on the GPU (moe_ops.h; moe_ops_cpu.cc is the
// reference). The kernels moved here unchanged from moe_router_cuda.cu and moe_cuda.cu, typed
// by the row data T (float, __nv_bfloat16) instead of a DType argument. One warp per token for
// the softmax, top-k and router backward (a token's E <= kMoeMaxExperts values in shared
// memory); the dispatch plan is a counting sort, one block per expert scanning every slot in
// order (block-wide prefix sums from warp ballots), so slots come out in (expert, token) order
// with no atomics; the per-sequence statistics count with shared-memory integer atomics (exact)
// and sum probabilities in a fixed order. The per-token sums of combine and permute backward
// use one block per token whose first thread orders the token's rows (at most kMoeMaxTopK), so
// every sum runs in row order. No atomics on floating-point values: bit-identical run to run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "model/variants/moe_ops.h"
#include "core/cuda/workspace.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: Ld, St, WarpSum (bf16.cuh)
using ::satdar::core::cuda::Launch;

constexpr int kWarps = 4;  // tokens per block in the per-token kernels
constexpr int kPlanThreads = 256;
constexpr int kThreads = 128;  // the row kernels
constexpr unsigned kFull = 0xffffffffu;

__device__ float WarpMax(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// The largest value and its index; ties go to the lower index.
__device__ void WarpArgMax(float* v, int* i) {
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(kFull, *v, off);
    const int oi = __shfl_xor_sync(kFull, *i, off);
    if (ov > *v || (ov == *v && oi < *i)) {
      *v = ov;
      *i = oi;
    }
  }
}

__global__ void RouteKernel(float* probs, float* lse, int* sel, float* weight,
                            const float* logits, int n, int e, int k, bool norm_topk) {
  __shared__ float cand_s[kWarps][kMoeMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tok = blockIdx.x * kWarps + warp;
  if (tok >= n) return;  // the whole warp leaves together
  const float* x = logits + static_cast<int64_t>(tok) * e;
  float* p = probs + static_cast<int64_t>(tok) * e;
  float* cand = cand_s[warp];
  float mx = -INFINITY;
  for (int j = lane; j < e; j += 32) mx = fmaxf(mx, x[j]);
  mx = WarpMax(mx);
  float sum = 0.0f;
  for (int j = lane; j < e; j += 32) sum += expf(x[j] - mx);
  sum = WarpSum(sum);
  for (int j = lane; j < e; j += 32) {
    const float pj = expf(x[j] - mx) / sum;
    p[j] = pj;
    // A NaN logit (a diverged run) makes every pj NaN; as candidates they count as 0, so the
    // choice stays a valid expert index and the NaN reaches the loss through lse and probs.
    cand[j] = fmaxf(pj, 0.0f);
  }
  if (lane == 0) lse[tok] = mx + logf(sum);
  __syncwarp();
  // k passes of arg-max; a chosen expert is marked -1 (probabilities are >= 0).
  float total = 0.0f;
  for (int c = 0; c < k; ++c) {
    float best = -2.0f;
    int idx = INT_MAX;
    for (int j = lane; j < e; j += 32) {
      if (cand[j] > best) {
        best = cand[j];
        idx = j;
      }
    }
    WarpArgMax(&best, &idx);
    if (lane == 0) {
      sel[static_cast<int64_t>(tok) * k + c] = idx;
      weight[static_cast<int64_t>(tok) * k + c] = best;
      cand[idx] = -1.0f;
    }
    total += best;
    __syncwarp();
  }
  if (norm_topk && lane < k) weight[static_cast<int64_t>(tok) * k + lane] /= total;
}

// counts[e] = number of slots routed to expert blockIdx.x.
__global__ void PlanCountKernel(int* counts, const int* sel, int64_t nk) {
  __shared__ int part[kPlanThreads];
  const int e = blockIdx.x;
  int cnt = 0;
  for (int64_t s = threadIdx.x; s < nk; s += blockDim.x) cnt += sel[s] == e;
  part[threadIdx.x] = cnt;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) counts[e] = part[0];
}

// Expert blockIdx.x's slots, in increasing slot (= token) order, at its offset in `slots`.
__global__ void PlanScatterKernel(int* slots, int* row_of_slot, const int* counts,
                                  const int* sel, int64_t nk) {
  __shared__ int warp_total[kPlanThreads / 32];
  __shared__ int offset;
  const int e = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    int o = 0;
    for (int j = 0; j < e; ++j) o += counts[j];
    offset = o;
  }
  __syncthreads();
  int running = offset;
  for (int64_t base = 0; base < nk; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    const bool mine = s < nk && sel[s] == e;
    const unsigned ballot = __ballot_sync(kFull, mine);
    if (lane == 0) warp_total[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, chunk = 0;
    for (int w = 0; w < kPlanThreads / 32; ++w) {
      if (w < warp) before += warp_total[w];
      chunk += warp_total[w];
    }
    if (mine) {
      const int row = running + before + __popc(ballot & ((1u << lane) - 1u));
      slots[row] = static_cast<int>(s);
      row_of_slot[s] = row;
    }
    running += chunk;
    __syncthreads();  // warp_total is rewritten by the next chunk
  }
}

// Sequence blockIdx.x: fraction (E) and sum_e f_e P_e into scratch[b].
__global__ void SeqStatsKernel(float* fraction, double* scratch, const float* probs,
                               const int* sel, int t, int e, int k) {
  __shared__ int hist[kMoeMaxExperts];
  __shared__ double contrib[kMoeMaxExperts];
  const int b = blockIdx.x;
  for (int j = threadIdx.x; j < e; j += blockDim.x) hist[j] = 0;
  __syncthreads();
  const int64_t tk = static_cast<int64_t>(t) * k;
  for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) atomicAdd(&hist[sel[b * tk + j]], 1);
  __syncthreads();
  for (int j = threadIdx.x; j < e; j += blockDim.x) {
    double sum = 0.0;
    for (int r = 0; r < t; ++r) sum += probs[(static_cast<int64_t>(b) * t + r) * e + j];
    const double f = static_cast<double>(hist[j]) / static_cast<double>(tk);
    fraction[static_cast<int64_t>(b) * e + j] = static_cast<float>(f);
    contrib[j] = f * (sum / t);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int j = 0; j < e; ++j) s += contrib[j];
    scratch[b] = s;
  }
}

__global__ void RouterLossKernel(double* loss_acc, const double* scratch, const float* lse,
                                 int b, int n, int e, double aux_coef, double z_coef,
                                 double scale) {
  __shared__ double part[kPlanThreads];
  double z = 0.0;
  for (int r = threadIdx.x; r < n; r += blockDim.x) z += static_cast<double>(lse[r]) * lse[r];
  part[threadIdx.x] = z;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double aux = 0.0;
    for (int j = 0; j < b; ++j) aux += e * scratch[j];
    *loss_acc += scale * (aux_coef * aux / b + z_coef * part[0] / n);
  }
}

template <typename T>
__global__ void RouteBackwardKernel(T* dlogits, const float* probs, const float* lse,
                                    const int* sel, const float* weight, const float* dweight,
                                    const float* fraction, int n, int t, int e, int k,
                                    bool norm_topk, float aux_grad, float z_grad) {
  __shared__ float dp_s[kWarps][kMoeMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tok = blockIdx.x * kWarps + warp;
  if (tok >= n) return;
  const int b = tok / t;
  const float* pr = probs + static_cast<int64_t>(tok) * e;
  float* dp = dp_s[warp];
  for (int j = lane; j < e; j += 32) dp[j] = aux_grad * fraction[static_cast<int64_t>(b) * e + j];
  __syncwarp();
  if (lane == 0) {
    const int* s = sel + static_cast<int64_t>(tok) * k;
    const float* w = weight + static_cast<int64_t>(tok) * k;
    const float* dw = dweight + static_cast<int64_t>(tok) * k;
    if (norm_topk) {
      float sum = 0.0f, dot = 0.0f;
      for (int c = 0; c < k; ++c) {
        sum += pr[s[c]];
        dot += dw[c] * w[c];
      }
      for (int c = 0; c < k; ++c) dp[s[c]] += (dw[c] - dot) / sum;
    } else {
      for (int c = 0; c < k; ++c) dp[s[c]] += dw[c];
    }
  }
  __syncwarp();
  float pdp = 0.0f;
  for (int j = lane; j < e; j += 32) pdp += pr[j] * dp[j];
  pdp = WarpSum(pdp);
  const float zl = z_grad * lse[tok];
  T* dl = dlogits + static_cast<int64_t>(tok) * e;
  for (int j = lane; j < e; j += 32) St(dl + j, pr[j] * (dp[j] - pdp) + zl * pr[j]);
}

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

absl::Status CheckRouter(int e, int k) {
  if (e <= 0 || e > kMoeMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE router cuda: num_experts ", e, " outside [1, ", kMoeMaxExperts, "]"));
  }
  if (k <= 0 || k > kMoeMaxTopK || k > e) {
    return absl::InvalidArgumentError(absl::StrCat("MoE router cuda: top_k ", k, " outside [1, ",
                                                   kMoeMaxTopK < e ? kMoeMaxTopK : e, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckTopK(int k) {
  if (k <= 0 || k > kMoeMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE cuda: top_k ", k, " outside [1, ", kMoeMaxTopK, "]"));
  }
  return absl::OkStatus();
}

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

unsigned TokenBlocks(int n) { return static_cast<unsigned>((n + kWarps - 1) / kWarps); }

}  // namespace

absl::Status MoeRoute(const core::CudaExec& exec, float* probs, float* lse, int* sel, float* weight,
                      const float* logits, int n, int e, int k, bool norm_topk) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckRouter(e, k); !st.ok()) return st;
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RouteKernel", RouteKernel, dim3(TokenBlocks(n)),
                                     dim3(kWarps * 32), 0, stream, probs, lse, sel, weight,
                                     logits, n, e, k, norm_topk));
  return absl::OkStatus();
}

absl::Status MoePlan(const core::CudaExec& exec, int* counts, int* slots, int* row_of_slot,
                     const int* sel, int n, int e, int k) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckRouter(e, k); !st.ok()) return st;
  const int64_t nk = static_cast<int64_t>(n) * k;
  if (nk > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE router cuda: ", nk, " slots exceed the int32 slot index"));
  }
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("PlanCountKernel", PlanCountKernel, dim3(e),
                                     dim3(kPlanThreads), 0, stream, counts, sel, nk));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("PlanScatterKernel", PlanScatterKernel, dim3(e),
                                     dim3(kPlanThreads), 0, stream, slots, row_of_slot, counts,
                                     sel, nk));
  return absl::OkStatus();
}

absl::Status MoeInvertSlots(const core::CudaExec& exec, int* row_of_slot, const int* slots,
                            int rows, int n, int k) {
  cudaStream_t stream = exec.stream;
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

absl::Status MoeRouterLoss(const core::CudaExec& exec, double* loss_acc, float* fraction,
                           const float* probs, const float* lse, const int* sel, int b, int t,
                           int e, int k, double aux_coef, double z_coef, double scale) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckRouter(e, k); !st.ok()) return st;
  if (b == 0 || t == 0) return absl::OkStatus();
  SATDAR_ASSIGN_OR_RETURN(double* scratch, core::cuda::Scratch<double>(exec, b, "MoeRouterLoss"));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("SeqStatsKernel", SeqStatsKernel, dim3(b),
                                     dim3(kPlanThreads), 0, stream, fraction, scratch, probs, sel,
                                     t, e, k));
  if (loss_acc == nullptr) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RouterLossKernel", RouterLossKernel, dim3(1),
                                     dim3(kPlanThreads), 0, stream, loss_acc, scratch, lse, b,
                                     b * t, e, aux_coef, z_coef, scale));
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeRouteBackward(const core::CudaExec& exec, T* dlogits, const float* probs,
                              const float* lse, const int* sel, const float* weight,
                              const float* dweight, const float* fraction, int b, int t, int e,
                              int k, bool norm_topk, double aux_grad, double z_grad) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckRouter(e, k); !st.ok()) return st;
  const int n = b * t;
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("RouteBackwardKernel", RouteBackwardKernel<T>,
                                     dim3(TokenBlocks(n)), dim3(kWarps * 32), 0, stream, dlogits,
                                     probs, lse, sel, weight, dweight, fraction, n, t, e, k,
                                     norm_topk, static_cast<float>(aux_grad),
                                     static_cast<float>(z_grad)));
  return absl::OkStatus();
}

template <typename T>
absl::Status MoePermute(const core::CudaExec& exec, T* xp, const T* x, const int* slots, int rows,
                        int k, int d) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckTopK(k); !st.ok()) return st;
  const int64_t total = static_cast<int64_t>(rows) * d;
  if (total == 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(Blocks(total), 65535 * 8));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("PermuteKernel", PermuteKernel<T>, dim3(blocks),
                                     dim3(kThreads), 0, stream, xp, x, slots, rows, k, d));
  return absl::OkStatus();
}

template <typename T>
absl::Status MoePermuteBackward(const core::CudaExec& exec, T* dx, const T* dxp,
                                const int* row_of_slot, int n, int k, int d) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckTopK(k); !st.ok()) return st;
  if (n == 0 || d == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("PermuteBackwardKernel", PermuteBackwardKernel<T>, dim3(n),
                                     dim3(kThreads), 0, stream, dx, dxp, row_of_slot, k, d));
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeCombine(const core::CudaExec& exec, T* out, const T* y, const float* weight,
                        const int* row_of_slot, int n, int k, int d) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckTopK(k); !st.ok()) return st;
  if (n == 0 || d == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("CombineKernel", CombineKernel<T>, dim3(n), dim3(kThreads),
                                     0, stream, out, y, weight, row_of_slot, k, d));
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeCombineBackward(const core::CudaExec& exec, T* dy, float* dweight, const T* dout,
                                const T* y, const float* weight, const int* slots, int rows, int k,
                                int d) {
  cudaStream_t stream = exec.stream;
  if (absl::Status st = CheckTopK(k); !st.ok()) return st;
  if (rows == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("CombineBackwardKernel", CombineBackwardKernel<T>,
                                     dim3(rows), dim3(kThreads), 0, stream, dy, dweight, dout, y,
                                     weight, slots, k, d));
  return absl::OkStatus();
}

#define SATDAR_MOE_OPS_INSTANTIATE(T)                                                              \
  template absl::Status MoeRouteBackward<T>(const core::CudaExec&, T*, const float*, const float*, \
                                            const int*, const float*, const float*, const float*,  \
                                            int, int, int, int, bool, double, double);             \
  template absl::Status MoePermute<T>(const core::CudaExec&, T*, const T*, const int*, int, int,   \
                                      int);                                                        \
  template absl::Status MoePermuteBackward<T>(const core::CudaExec&, T*, const T*, const int*,     \
                                              int, int, int);                                      \
  template absl::Status MoeCombine<T>(const core::CudaExec&, T*, const T*, const float*,           \
                                      const int*, int, int, int);                                  \
  template absl::Status MoeCombineBackward<T>(const core::CudaExec&, T*, float*, const T*,         \
                                              const T*, const float*, const int*, int, int, int);
SATDAR_MOE_OPS_INSTANTIATE(float)
SATDAR_MOE_OPS_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_MOE_OPS_INSTANTIATE

}  // namespace satdar::model::cuda
