// model/variants/moe_router_cuda.h: the MoE router of moe.cc on the GPU - softmax and top-k,
// the dispatch plan, the sequence-wise aux loss and z-loss (MODELS.md section 6), and the
// router's backward. With moe_cuda.h (permute, combine) and the grouped GEMMs of
// core/ops/gemm_cuda.h this is the whole MoE FFN (model/gpu/gpu_moe.cc puts it together).
//
// N = B * T tokens, E experts, k choices per token; slot = token * k + choice. Router logits,
// probabilities, log-sum-exps, routing weights and their gradients are fp32; the logits'
// gradient is written in the compute dtype (f32 or bf16) for the router's GEMMs. No atomics on
// floating-point values: every sum runs in a fixed order, so results are bit-identical run to
// run. All pointers are device pointers; calls are asynchronous on `stream`.
//
//   route:    probs = softmax(logits) per token; lse = logsumexp(logits); sel = the k experts
//             with the largest probabilities in decreasing order (ties to the lower index, as
//             moe.cc's stable sort); weight = their probabilities (divided by their sum when
//             norm_topk)
//   plan:     counts[e] = slots routed to e; slots (N*k) = every slot in (expert, token) order
//             (moe.cc's send_slots, dropless); row_of_slot (N*k) its inverse
//   loss:     fraction (B, E) = f_e^b; *loss_acc (fp64) += scale * (aux_coef * mean_b E sum_e
//             f_e^b P_e^b + z_coef * mean lse^2)
//   backward: dlogits from dweight (d loss / d weight, fp32 N*k) and the aux and z losses:
//             aux_grad = scale * aux_coef * E / (B*T), z_grad = scale * z_coef * 2 / N (moe.cc)
#ifndef SATDAR_MODEL_VARIANTS_MOE_ROUTER_CUDA_H_
#define SATDAR_MODEL_VARIANTS_MOE_ROUTER_CUDA_H_

#include "absl/status/status.h"
#include "core/dtype.h"

struct CUstream_st;  // cudaStream_t

namespace satdar::model::cuda {

constexpr int kMoeMaxExperts = 256;

absl::Status MoeRoute(float* probs, float* lse, int* sel, float* weight, const float* logits,
                      int n, int e, int k, bool norm_topk, CUstream_st* stream = nullptr);

absl::Status MoePlan(int* counts, int* slots, int* row_of_slot, const int* sel, int n, int e,
                     int k, CUstream_st* stream = nullptr);

// scratch: fp64 device memory of b elements. loss_acc may be null: then only `fraction` is
// computed (for a recomputed forward whose loss was already counted).
absl::Status MoeRouterLoss(double* loss_acc, float* fraction, double* scratch, const float* probs,
                           const float* lse, const int* sel, int b, int t, int e, int k,
                           double aux_coef, double z_coef, double scale,
                           CUstream_st* stream = nullptr);

// dlogits (N, E) of `dtype` overwritten.
absl::Status MoeRouteBackward(core::DType dtype, void* dlogits, const float* probs,
                              const float* lse, const int* sel, const float* weight,
                              const float* dweight, const float* fraction, int b, int t, int e,
                              int k, bool norm_topk, double aux_grad, double z_grad,
                              CUstream_st* stream = nullptr);

}  // namespace satdar::model::cuda

#endif  // SATDAR_MODEL_VARIANTS_MOE_ROUTER_CUDA_H_
