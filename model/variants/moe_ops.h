// model/variants/moe_ops.h: the arithmetic of the MoE FFN's router, dispatch plan, permute and
// combine (variants/moe.cc decides the data flow on both devices: the router and expert
// GEMMs, the expert-parallel AllToAllV exchanges and expert grouping, the shared experts), one
// header for both devices: cpu:: (moe_ops_cpu.cc, the readable reference, f32 and f64) and
// cuda:: (moe_ops_cuda.cu, fp32 routing values, row data in f32 or bf16). Tested against each
// other by moe_ops_test (the CUDA side tag gpu).
//
// N = B * T tokens, E experts, k choices per token, D the hidden size; slot = token * k + choice;
// R = N * k rows of the expert-grouped buffer (dropless: every slot is a row).
//   route:     probs (N, E) = softmax(logits); lse (N) = logsumexp(logits); sel (N, k) = the k
//              experts of the largest probabilities, decreasing (ties to the lower index: the
//              CPU's stable sort); weight (N, k) = their probabilities (divided by their sum
//              with norm_topk)                                                    MoeRoute
//   plan:      counts (E) = slots routed to each expert; slots (R) = every slot in (expert,
//              token) order; row_of_slot (N*k) = its inverse                      MoePlan
//   losses:    fraction (B, E) = f_e^b, the share of sequence b's T*k choices that went to e;
//              *loss_acc += scale * (aux_coef * mean_b E sum_e f_e^b P_e^b
//              + z_coef * mean lse^2), P_e^b the mean probability of e over sequence b
//                                                                                  MoeRouterLoss
//   backward:  dlogits (N, E) from dweight (N, k) (d loss / d weight) and the two losses, with
//              aux_grad = scale * aux_coef * E / (B*T), z_grad = scale * z_coef * 2 / N
//                                                                             MoeRouteBackward
//   permute:   xp[r] = x[slots[r] / k]                      (R, D) from (N, D)     MoePermute
//   combine:   out[tok] = sum_{rows r of tok, increasing} w[slot_r] y[r]  (overwritten)
//                                                                                   MoeCombine
//   combine backward: dy[r] = w[slot_r] dout[tok]; dweight[slot_r] = y[r] . dout[tok]
//                                                                           MoeCombineBackward
//   permute backward: dx[tok] += sum_{rows r of tok, increasing} dxp[r]    MoePermuteBackward
//
// The CPU side keeps the CPU model's results bit for bit: per element the same operations in
// the same order as the loops that were inline in moe.cc (the stable sort's tie order, out
// filled with zeros and then accumulated row by row in (expert, token) order, the losses'
// double sums in token and expert order). Both sides are called as ops::X(exec, ...) (the
// namespace ops at the end), exec a core::CpuExec or a core::CudaExec. Differences between the
// two sides' arguments: MoePlan, MoeInvertSlots and MoeRouterLoss are serial on the CPU (their
// sums in a fixed order; the pool is unused); CUDA's fraction is fp32 where the CPU keeps it in
// double (its aux gradient multiplies in double).
#ifndef SATDAR_MODEL_VARIANTS_MOE_OPS_H_
#define SATDAR_MODEL_VARIANTS_MOE_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace satdar::core {
class ThreadPool;
}  // namespace satdar::core

namespace satdar::model {

// The GPU kernels' limits (a token's E probabilities in shared memory, its k rows ordered in
// shared memory); CheckDeviceSupport (model/layout_check.h) refuses larger configs. The CPU
// side has none.
inline constexpr int kMoeMaxExperts = 256;
inline constexpr int kMoeMaxTopK = 16;

namespace cpu {

// probs (N, E), lse (N), sel (N, k), weight (N, k) from logits (N, E).
template <typename T>
void MoeRoute(T* probs, T* lse, int* sel, T* weight, const T* logits, int n, int e, int k,
              bool norm_topk, core::ThreadPool* pool);

// counts (E), slots (N*k), row_of_slot (N*k) from sel (N, k).
void MoePlan(int* counts, int* slots, int* row_of_slot, const int* sel, int n, int e, int k);

// row_of_slot (N*k) = -1 everywhere, then row_of_slot[slots[r]] = r for r < rows.
void MoeInvertSlots(int* row_of_slot, const int* slots, int rows, int n, int k);

// fraction (B, E) (overwritten; double) from sel (N, k); with loss_acc non-null, *loss_acc +=
// scale * (aux + z), probs (N, E) and lse (N) read only then.
template <typename T>
void MoeRouterLoss(double* loss_acc, double* fraction, const T* probs, const T* lse,
                   const int* sel, int b, int t, int e, int k, double aux_coef, double z_coef,
                   double scale);

// dlogits (N, E) (overwritten) from weight and dweight (N, k), fraction (B, E) and the forward's
// probs, lse and sel.
template <typename T>
void MoeRouteBackward(T* dlogits, const T* probs, const T* lse, const int* sel, const T* weight,
                      const T* dweight, const double* fraction, int b, int t, int e, int k,
                      bool norm_topk, double aux_grad, double z_grad, core::ThreadPool* pool);

// xp (rows, D) from x (N, D).
template <typename T>
void MoePermute(T* xp, const T* x, const int* slots, int rows, int k, int d,
                core::ThreadPool* pool);

// dx (N, D) += the rows of dxp (R, D) that came from each token, one at a time in row order.
template <typename T>
void MoePermuteBackward(T* dx, const T* dxp, const int* row_of_slot, int n, int k, int d,
                        core::ThreadPool* pool);

// out (N, D) (overwritten) from y (R, D) and weight (N*k).
template <typename T>
void MoeCombine(T* out, const T* y, const T* weight, const int* row_of_slot, int n, int k, int d,
                core::ThreadPool* pool);

// dy (rows, D) and dweight (N*k; slots not in `slots` untouched) overwritten.
template <typename T>
void MoeCombineBackward(T* dy, T* dweight, const T* dout, const T* y, const T* weight,
                        const int* slots, int rows, int k, int d, core::ThreadPool* pool);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// T (row data: x, xp, y, out, their gradients, dlogits for the router's GEMMs) is float or
// __nv_bfloat16; the routing values (logits, probs, lse, weight, dweight, fraction) are fp32,
// the loss fp64, all arithmetic fp32 (the losses' sums fp64). Device pointers, enqueued on
// exec.stream. No atomics on floating-point values: every sum runs in a fixed order, results are
// bit-identical run to run. A NaN logit leaves every choice a valid expert (the NaN reaches
// the loss through lse and probs). The router ops return InvalidArgument for E outside
// [1, kMoeMaxExperts] or k outside [1, min(kMoeMaxTopK, E)]; the row ops for k outside
// [1, kMoeMaxTopK].
absl::Status MoeRoute(const core::CudaExec& exec, float* probs, float* lse, int* sel, float* weight,
                      const float* logits, int n, int e, int k, bool norm_topk);
absl::Status MoePlan(const core::CudaExec& exec, int* counts, int* slots, int* row_of_slot,
                     const int* sel, int n, int e, int k);
absl::Status MoeInvertSlots(const core::CudaExec& exec, int* row_of_slot, const int* slots,
                            int rows, int n, int k);
// Its scratch (fp64, B elements: each sequence's sum_e f_e^b P_e^b) comes from
// exec.workspace (FailedPrecondition without one). loss_acc may be null: then only `fraction` is
// computed (for a recomputed forward whose loss was counted already).
absl::Status MoeRouterLoss(const core::CudaExec& exec, double* loss_acc, float* fraction,
                           const float* probs, const float* lse, const int* sel, int b, int t,
                           int e, int k, double aux_coef, double z_coef, double scale);
template <typename T>
absl::Status MoeRouteBackward(const core::CudaExec& exec, T* dlogits, const float* probs,
                              const float* lse, const int* sel, const float* weight,
                              const float* dweight, const float* fraction, int b, int t, int e,
                              int k, bool norm_topk, double aux_grad, double z_grad);
template <typename T>
absl::Status MoePermute(const core::CudaExec& exec, T* xp, const T* x, const int* slots, int rows,
                        int k, int d);
template <typename T>
absl::Status MoePermuteBackward(const core::CudaExec& exec, T* dx, const T* dxp,
                                const int* row_of_slot, int n, int k, int d);
template <typename T>
absl::Status MoeCombine(const core::CudaExec& exec, T* out, const T* y, const float* weight,
                        const int* row_of_slot, int n, int k, int d);
template <typename T>
absl::Status MoeCombineBackward(const core::CudaExec& exec, T* dy, float* dweight, const T* dout,
                                const T* y, const float* weight, const int* slots, int rows, int k,
                                int d);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(exec, ...) with exec a core::CpuExec (the cpu:: reference)
// or a core::CudaExec (the cuda:: launcher).
namespace ops {

template <typename T>
inline absl::Status MoeRoute(const core::CpuExec& exec, T* probs, T* lse, int* sel, T* weight,
                             const T* logits, int n, int e, int k, bool norm_topk) {
  cpu::MoeRoute(probs, lse, sel, weight, logits, n, e, k, norm_topk, exec.pool);
  return absl::OkStatus();
}
inline absl::Status MoePlan(const core::CpuExec& exec, int* counts, int* slots, int* row_of_slot,
                            const int* sel, int n, int e, int k) {
  (void)exec;
  cpu::MoePlan(counts, slots, row_of_slot, sel, n, e, k);
  return absl::OkStatus();
}
inline absl::Status MoeInvertSlots(const core::CpuExec& exec, int* row_of_slot, const int* slots,
                                   int rows, int n, int k) {
  (void)exec;
  cpu::MoeInvertSlots(row_of_slot, slots, rows, n, k);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MoeRouterLoss(const core::CpuExec& exec, double* loss_acc, double* fraction,
                                  const T* probs, const T* lse, const int* sel, int b, int t, int e,
                                  int k, double aux_coef, double z_coef, double scale) {
  (void)exec;
  cpu::MoeRouterLoss(loss_acc, fraction, probs, lse, sel, b, t, e, k, aux_coef, z_coef, scale);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MoeRouteBackward(const core::CpuExec& exec, T* dlogits, const T* probs,
                                     const T* lse, const int* sel, const T* weight,
                                     const T* dweight, const double* fraction, int b, int t, int e,
                                     int k, bool norm_topk, double aux_grad, double z_grad) {
  cpu::MoeRouteBackward(dlogits, probs, lse, sel, weight, dweight, fraction, b, t, e, k, norm_topk,
                        aux_grad, z_grad, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MoePermute(const core::CpuExec& exec, T* xp, const T* x, const int* slots,
                               int rows, int k, int d) {
  cpu::MoePermute(xp, x, slots, rows, k, d, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MoePermuteBackward(const core::CpuExec& exec, T* dx, const T* dxp,
                                       const int* row_of_slot, int n, int k, int d) {
  cpu::MoePermuteBackward(dx, dxp, row_of_slot, n, k, d, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MoeCombine(const core::CpuExec& exec, T* out, const T* y, const T* weight,
                               const int* row_of_slot, int n, int k, int d) {
  cpu::MoeCombine(out, y, weight, row_of_slot, n, k, d, exec.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MoeCombineBackward(const core::CpuExec& exec, T* dy, T* dweight, const T* dout,
                                       const T* y, const T* weight, const int* slots, int rows,
                                       int k, int d) {
  cpu::MoeCombineBackward(dy, dweight, dout, y, weight, slots, rows, k, d, exec.pool);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::MoeCombine;
using cuda::MoeCombineBackward;
using cuda::MoeInvertSlots;
using cuda::MoePermute;
using cuda::MoePermuteBackward;
using cuda::MoePlan;
using cuda::MoeRoute;
using cuda::MoeRouteBackward;
using cuda::MoeRouterLoss;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_MOE_OPS_H_
