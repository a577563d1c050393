// model/variants/moe_cuda.h: the MoE dispatch data movement of moe.cc on the GPU.
//
// The routing plan is moe.cc's: every (token, choice) slot = token * k + choice is sent, in
// (expert, token) order, as one row of the expert-grouped buffer; `slots` (R) lists the slot of
// each row r (Moe's send_slots; R = N * k when dropless) and `row_of_slot` (N * k) is its
// inverse (-1 for a slot that is not dispatched), made by MoeInvertSlots. Routing weights are
// fp32 (N * k), indexed by slot. Row data (x, y, out and their gradients) are f32 or bf16 with
// fp32 arithmetic. Sums over a token's rows run in increasing row order, i.e. in the CPU's
// (expert, token) order. All pointers are device pointers; calls are asynchronous on `stream`.
//
//   permute:          xp[r] = x[slots[r] / k]
//   combine:          out[tok] = sum_{r of tok} w[slot_r] * y[r]           (overwrites out)
//   combine backward: dy[r] = w[slot_r] * dout[tok];  dw[slot_r] = y[r] . dout[tok]
//   permute backward: dx[tok] += sum_{r of tok} dxp[r]
#ifndef SATDAR_MODEL_VARIANTS_MOE_CUDA_H_
#define SATDAR_MODEL_VARIANTS_MOE_CUDA_H_

#include "absl/status/status.h"
#include "core/dtype.h"

struct CUstream_st;  // cudaStream_t

namespace satdar::model::cuda {

constexpr int kMoeMaxTopK = 16;

// row_of_slot (N*k) = -1 everywhere, then row_of_slot[slots[r]] = r.
absl::Status MoeInvertSlots(int* row_of_slot, const int* slots, int rows, int n, int k,
                            CUstream_st* stream = nullptr);

// xp (R, D) from x (N, D).
absl::Status MoePermute(core::DType dtype, void* xp, const void* x, const int* slots, int rows,
                        int k, int d, CUstream_st* stream = nullptr);

// dx (N, D) += the rows of dxp (R, D) that came from each token.
absl::Status MoePermuteBackward(core::DType dtype, void* dx, const void* dxp,
                                const int* row_of_slot, int n, int k, int d,
                                CUstream_st* stream = nullptr);

// out (N, D) = weighted sum of each token's expert outputs y (R, D).
absl::Status MoeCombine(core::DType dtype, void* out, const void* y, const float* weight,
                        const int* row_of_slot, int n, int k, int d,
                        CUstream_st* stream = nullptr);

// dy (R, D) and dweight (N*k, fp32) overwritten (dweight of undispatched slots untouched).
absl::Status MoeCombineBackward(core::DType dtype, void* dy, float* dweight, const void* dout,
                                const void* y, const float* weight, const int* slots, int rows,
                                int k, int d, CUstream_st* stream = nullptr);

}  // namespace satdar::model::cuda

#endif  // SATDAR_MODEL_VARIANTS_MOE_CUDA_H_
