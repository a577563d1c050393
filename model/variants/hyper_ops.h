// model/variants/hyper_ops.h: the arithmetic of the n-stream residuals, Hyper-Connections
// (variants/hyper_connections.cc) and mHC (variants/mhc.cc), which decide the data flow (the
// projection GEMMs, HC's RMSNorm, the branch calls, the pipeline boundaries); one header for
// both devices: cpu:: (hyper_ops_cpu.cc, the readable reference, f32 and f64) and cuda::
// (hyper_ops_cuda.cu, fp32 coefficients, H in f32 or bf16). Tested against each other by
// hyper_ops_test (the CUDA side tag gpu).
//
// The hyper state H (N, n, C) (N = B*T rows) is stored interleaved: token r, stream j at
// (r*n + j)*C. Per token the residual is
//   entry: H_j = h0 for every j                            StreamsBroadcast
//   width: u = sum_j pre_j H_j                             HyperWidthForward
//   the branch y = f(u)                                    the caller
//   depth: H'_m = post_m y + sum_j res_jm H_j              HyperDepthForward
//   exit:  x = sum_j H_j                                   StreamsSum
// and back: HyperDepthBackward, HyperWidthBackward (dH and the coefficients' gradients);
// the backward of entry is StreamsSum, of exit StreamsBroadcast. HyperCoefs<F> says where a
// design keeps pre, post and res (F: T on the CPU, fp32 on the GPU), so HC and mHC share them.
// A pipeline boundary carries the n streams as n tensors (N, C): JoinStreams / SplitStreams
// (pure copies; hyper_streams.h decides when).
//
// HC (coefficients per token from the n rows RMSNorm(H_j), the caller's):
//   ta (N*n, lda) = RMSNorm(H_j) dynamic_alpha^T (n+1 columns), tb (N*n, ldb) = ... dynamic_beta^T
//   [pre_j | res_j.] = static_alpha_j + alpha_scale tanh(ta_j)   HcCoefForward (ta, tb <- tanh)
//   post_j = static_beta_j + beta_scale tanh(tb_j)                coef (N, n(n+2)): HcCoefs
// and back: HcCoefBackward (d/d ta, d/d tb for the caller's GEMMs; the four parameters').
// The CPU keeps ta and tb as two buffers (lda = n+1, ldb = 1), the GPU one projection buffer
// (tb = ta + n + 1, lda = ldb = ld).
//
// mHC, per token r with vec(H) of nc = n*C entries and mixes = n(n+2) mix logits laid out
// [pre n | post n | res n*n]:
//   raw (N, ld) = vec(H) fn^T, ld >= mixes                the caller (GEMM)
//   rms = 1 / sqrt(mean(vec(H)^2) + eps)                   MhcRms
//   pre_j = sigmoid(scale[0] raw_j rms + base_j)           MhcCoefForward: coef (N, 2n)
//   post_j = 2 sigmoid(scale[1] raw_{n+j} rms + base_{n+j})
//   Z_jk = scale[2] raw_{2n+jn+k} rms + base_{2n+jn+k}     MhcCoefForward: logits (N, n, n)
//   M_0 = row softmax of Z; M_s = M_{s-1} with its columns (s odd) or rows (s even) divided
//   by their sums, s = 1 .. 2 iterations - 1 (ending on a column one)   SinkhornForward
// and back: SinkhornBackward (dlogits from dM_last), MhcCoefBackward (draw = d/d raw for the
// caller's GEMMs, scale's and base's gradients, and the rms path into dH).
//
// The CPU side keeps the CPU model's results bit for bit: per element the same operations in
// the same order as the loops that were inline in hyper_connections.cc / mhc.cc /
// hyper_streams.h; the sums of the parameters' gradients over the rows run in row order
// (HC's scales and mHC's scale and base in double), serially, as before.
#ifndef SATDAR_MODEL_VARIANTS_HYPER_OPS_H_
#define SATDAR_MODEL_VARIANTS_HYPER_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace satdar::core {
class ThreadPool;
}  // namespace satdar::core

namespace satdar::model::cuda {
// The most streams the CUDA side takes (per-thread arrays); also checked by CheckDeviceSupport
// (model/layout_check.h, any build).
inline constexpr int kMaxHyperStreams = 8;
}  // namespace satdar::model::cuda

namespace satdar::model {

// mHC's Sinkhorn iterations (column normalisations): the steps buffers hold 2x this many
// (n, n) matrices per token.
inline constexpr int kMhcSinkhornIterations = 20;

// Where token r's coefficients lie: pre_j = pre[r*pre_token + j*pre_step],
// post_m = post[r*post_token + m], res_jm = res[r*res_token + j*res_row + m]. F is T on the
// CPU and float on the GPU; the same struct describes gradients (written) and values (read).
template <typename F>
struct HyperCoefs {
  F* pre = nullptr;
  F* post = nullptr;
  F* res = nullptr;
  int64_t pre_token = 0, pre_step = 1, post_token = 0, res_token = 0, res_row = 0;
};

// HC's coefficient layout, coef (N, n(n+2)) per token: the (n, n+1) matrix [pre_j | res_j.]
// then post (n).
template <typename F>
HyperCoefs<F> HcCoefs(F* coef, int n) {
  HyperCoefs<F> c;
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

namespace cpu {

// rms (N) = 1 / sqrt(sum_e h[r, e]^2 / nc + eps), h (N, nc); the sum in T, in element order.
template <typename T>
void MhcRms(T* rms, const T* h, int rows, int nc, double eps, core::ThreadPool* pool);

// coef (N, 2n) = [pre | post], logits (N, n, n) = Z, from raw (N, ld) (columns >= mixes
// ignored), rms (N), scale (3) and base (mixes) (the parameters).
template <typename T>
void MhcCoefForward(T* coef, T* logits, const T* raw, int ld, const T* rms, const T* scale,
                    const T* base, int rows, int n, core::ThreadPool* pool);

// steps (N, 2 iterations, n, n) = M_0 .. M_{2 iterations - 1} (kept for the backward; token r's
// result is steps[r, 2 iterations - 1]) from logits (N, n, n).
template <typename T>
void SinkhornForward(T* steps, const T* logits, int rows, int n, int iterations,
                     core::ThreadPool* pool);
// dlogits (N, n, n) (overwritten) = d/dZ of dfinal (N, n, n), the gradient of the last matrix.
template <typename T>
void SinkhornBackward(T* dlogits, const T* dfinal, const T* steps, int rows, int n,
                      int iterations, core::ThreadPool* pool);

// From dcoef (N, mixes) = [dpre | dpost | ignored] and dlogits (N, n, n) (SinkhornBackward's):
//   dz (N, mixes), the gradient of each mix logit (overwritten);
//   draw (N, ld) = dz scale[group] rms (overwritten; padding columns 0) -- d/d raw;
//   grad_scale (3) += sum_r sum_group dz raw rms, grad_base (mixes) += sum_r dz (double sums
//   in row order, added once);
//   dh (N, nc) += -rms^3 / nc (sum_k dz_k scale[group] raw_k) h (the rms path).
// draw may alias dcoef when ld == mixes (a row is read before it is written; the CPU model
// does so); nothing else may alias.
template <typename T>
void MhcCoefBackward(T* draw, T* dz, T* grad_scale, T* grad_base, T* dh, const T* dcoef,
                     const T* dlogits, const T* coef, const T* raw, int ld, const T* rms,
                     const T* scale, const T* h, int rows, int n, int nc,
                     core::ThreadPool* pool);


// ---- The stream mixing (HC and mHC).

// out (N, n, C) = in (N, C) in every stream (entry; the backward of exit).
template <typename T>
void StreamsBroadcast(T* out, const T* in, int rows, int n, int c, core::ThreadPool* pool);
// out (N, C) = sum over the n streams of in (N, n, C), in stream order (exit; the backward
// of entry). Overwritten.
template <typename T>
void StreamsSum(T* out, const T* in, int rows, int n, int c, core::ThreadPool* pool);
// A pipeline boundary (pure copies): hyper (N, n, C) <- stream j from parts[j] (N, C), and
// parts[j] (N, C) <- stream j of hyper (N, n, C). parts: an array of n pointers.
template <typename T>
void JoinStreams(T* hyper, const T* const* parts, int rows, int n, int c, core::ThreadPool* pool);
template <typename T>
void SplitStreams(T* const* parts, const T* hyper, int rows, int n, int c, core::ThreadPool* pool);

// u (N, C) = sum_j pre_j H_j (overwritten; added in stream order).
template <typename T>
void HyperWidthForward(T* u, const T* h, const HyperCoefs<T>& coefs, int rows, int n, int c,
                       core::ThreadPool* pool);
// h_out (N, n, C): stream m = post_m y + sum_j res_jm H_j (h_out must not alias h).
template <typename T>
void HyperDepthForward(T* h_out, const T* h, const T* y, const HyperCoefs<T>& coefs, int rows,
                       int n, int c, core::ThreadPool* pool);
// From g (N, n, C), the gradient of h_out: dy (N, C) = sum_m post_m g_m and dh (N, n, C)
// with dh_j = sum_m res_jm g_m (both overwritten; added in m order); dcoefs' post_m =
// <y, g_m> and res_jm = <H_j, g_m> (written).
template <typename T>
void HyperDepthBackward(T* dy, T* dh, const HyperCoefs<T>& dcoefs, const T* g, const T* y,
                        const T* h, const HyperCoefs<T>& coefs, int rows, int n, int c,
                        core::ThreadPool* pool);
// From du (N, C), the gradient of u: dh_j += pre_j du; dcoefs' pre_j = <H_j, du> (written).
template <typename T>
void HyperWidthBackward(T* dh, const HyperCoefs<T>& dcoefs, const T* du, const T* h,
                        const HyperCoefs<T>& coefs, int rows, int n, int c,
                        core::ThreadPool* pool);

// ---- HC's coefficients.

// ta (N*n, lda) (columns 0..n) and tb (N*n, ldb) (column 0) are replaced by their tanh;
// coef (N, n(n+2)) in HcCoefs' layout = static + scale * tanh. static_alpha (n, n+1),
// static_beta (n), alpha_scale and beta_scale (one value each): the parameters.
template <typename T>
void HcCoefForward(T* coef, T* ta, int lda, T* tb, int ldb, const T* static_alpha,
                   const T* static_beta, const T* alpha_scale, const T* beta_scale, int rows,
                   int n, core::ThreadPool* pool);
// From dcoef (N, n(n+2)) in HcCoefs' layout (the mixing backward's) and ta, tb (the tanh
// HcCoefForward left): dta (N*n, lda), dtb (N*n, ldb) = dcoef scale (1 - tanh^2) (columns
// 0..n resp. 0 written, others untouched), the gradients before the tanh; grad_static_alpha,
// grad_static_beta += the sums of dcoef over the rows, grad_alpha_scale, grad_beta_scale +=
// sum dcoef tanh (row order; the scales' in double, added once). Nothing may alias.
template <typename T>
void HcCoefBackward(T* dta, T* dtb, T* grad_static_alpha, T* grad_static_beta,
                    T* grad_alpha_scale, T* grad_beta_scale, const T* dcoef, const T* ta,
                    int lda, const T* tb, int ldb, const T* alpha_scale, const T* beta_scale,
                    int rows, int n, core::ThreadPool* pool);

}  // namespace cpu

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

namespace cuda {

// T (h, dh, draw) is float or __nv_bfloat16; rms, coef, logits, steps, dcoef, dlogits, dz, raw
// (the GEMM's fp32 output) and the parameters (fp32 master weights and gradients) are fp32,
// and all arithmetic is fp32. Device pointers, enqueued on x.stream. Deterministic: per token
// one thread (coefficients, Sinkhorn) or one block with a fixed tree (MhcRms); the sums over
// tokens are ColumnSums (below: fixed partition and tree). No atomics. Every op returns
// InvalidArgument for n outside [1, kMaxHyperStreams] or ld < mixes (mHC) / lda < n + 1 (HC).
template <typename T>
absl::Status MhcRms(const core::CudaExec& x, float* rms, const T* h, int rows, int nc, float eps);
absl::Status MhcCoefForward(const core::CudaExec& x, float* coef, float* logits, const float* raw,
                            int ld, const float* rms, const float* scale, const float* base,
                            int rows, int n);
absl::Status SinkhornForward(const core::CudaExec& x, float* steps, const float* logits, int rows,
                             int n, int iterations);
absl::Status SinkhornBackward(const core::CudaExec& x, float* dlogits, const float* dfinal,
                              const float* steps, int rows, int n, int iterations);
// Its scratch, (N, 4) fp32 from x.workspace (per token the three scale sums and the rms
// path's coefficient, summed over tokens in a fixed order afterwards; FailedPrecondition
// without a workspace). draw must not alias dcoef here (dcoef is fp32, draw of T).
template <typename T>
absl::Status MhcCoefBackward(const core::CudaExec& x, T* draw, float* dz, float* grad_scale,
                             float* grad_base, T* dh, const float* dcoef, const float* dlogits,
                             const float* coef, const float* raw, int ld, const float* rms,
                             const float* scale, const T* h, int rows, int n, int nc);

// The stream mixing (T is float or __nv_bfloat16; coefficients fp32). Elementwise kernels walk
// (token, stream, channel) with a grid stride; the dot products run a block per token (or
// token and stream) with a fixed tree.
template <typename T>
absl::Status StreamsBroadcast(const core::CudaExec& x, T* out, const T* in, int rows, int n, int c);
template <typename T>
absl::Status StreamsSum(const core::CudaExec& x, T* out, const T* in, int rows, int n, int c);
// parts: a device array of n device pointers (a published PtrList, model/backend.h).
template <typename T>
absl::Status JoinStreams(const core::CudaExec& x, T* hyper, const T* const* parts, int rows, int n,
                         int c);
template <typename T>
absl::Status SplitStreams(const core::CudaExec& x, T* const* parts, const T* hyper, int rows, int n,
                          int c);
template <typename T>
absl::Status HyperWidthForward(const core::CudaExec& x, T* u, const T* h,
                               const HyperCoefs<float>& coefs, int rows, int n, int c);
// h_out must not alias h (as on the CPU).
template <typename T>
absl::Status HyperDepthForward(const core::CudaExec& x, T* h_out, const T* h, const T* y,
                               const HyperCoefs<float>& coefs, int rows, int n, int c);
template <typename T>
absl::Status HyperDepthBackward(const core::CudaExec& x, T* dy, T* dh,
                                const HyperCoefs<float>& dcoefs, const T* g, const T* y, const T* h,
                                const HyperCoefs<float>& coefs, int rows, int n, int c);
template <typename T>
absl::Status HyperWidthBackward(const core::CudaExec& x, T* dh, const HyperCoefs<float>& dcoefs,
                                const T* du, const T* h, const HyperCoefs<float>& coefs, int rows,
                                int n, int c);

// HC's coefficients: ta, tb are the fp32 GEMM outputs (one buffer: tb = ta + n + 1, lda = ldb
// >= n + 2; a tb overlapping ta's n+1 columns is InvalidArgument).
absl::Status HcCoefForward(const core::CudaExec& x, float* coef, float* ta, int lda, float* tb,
                           int ldb, const float* static_alpha, const float* static_beta,
                           const float* alpha_scale, const float* beta_scale, int rows, int n);
// dta, dtb of T (the GEMMs' operands; their columns past the n+1 and 1 written are left as
// they are). Its scratch, (N, 2) fp32 from x.workspace (per token the two scale sums, summed
// over tokens in a fixed order afterwards; FailedPrecondition without a workspace).
template <typename T>
absl::Status HcCoefBackward(const core::CudaExec& x, T* dta, T* dtb, float* grad_static_alpha,
                            float* grad_static_beta, float* grad_alpha_scale,
                            float* grad_beta_scale, const float* dcoef, const float* ta, int lda,
                            const float* tb, int ldb, const float* alpha_scale,
                            const float* beta_scale, int rows, int n);

// A helper without a CPU twin (also used by muddformer_ops_cuda.cu): out[k] += sum over rows r
// of in[r*ld + k], k < cols (fp32; one block per column, a fixed partition of the rows and a
// fixed tree: deterministic).
absl::Status ColumnSums(const core::CudaExec& x, float* out, const float* in, int rows, int cols,
                        int ld);

}  // namespace cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

// One call text for both devices: ops::X(x, ...) with x a core::CpuExec (the cpu:: reference)
// or a core::CudaExec (the cuda:: launcher).
// ColumnSums has no CPU twin and stays cuda:: only.
namespace ops {

template <typename T>
inline absl::Status MhcRms(const core::CpuExec& x, T* rms, const T* h, int rows, int nc,
                           double eps) {
  cpu::MhcRms(rms, h, rows, nc, eps, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MhcCoefForward(const core::CpuExec& x, T* coef, T* logits, const T* raw, int ld,
                                   const T* rms, const T* scale, const T* base, int rows, int n) {
  cpu::MhcCoefForward(coef, logits, raw, ld, rms, scale, base, rows, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status SinkhornForward(const core::CpuExec& x, T* steps, const T* logits, int rows,
                                    int n, int iterations) {
  cpu::SinkhornForward(steps, logits, rows, n, iterations, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status SinkhornBackward(const core::CpuExec& x, T* dlogits, const T* dfinal,
                                     const T* steps, int rows, int n, int iterations) {
  cpu::SinkhornBackward(dlogits, dfinal, steps, rows, n, iterations, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status MhcCoefBackward(const core::CpuExec& x, T* draw, T* dz, T* grad_scale,
                                    T* grad_base, T* dh, const T* dcoef, const T* dlogits,
                                    const T* coef, const T* raw, int ld, const T* rms,
                                    const T* scale, const T* h, int rows, int n, int nc) {
  cpu::MhcCoefBackward(draw, dz, grad_scale, grad_base, dh, dcoef, dlogits, coef, raw, ld, rms,
                       scale, h, rows, n, nc, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status StreamsBroadcast(const core::CpuExec& x, T* out, const T* in, int rows, int n,
                                     int c) {
  cpu::StreamsBroadcast(out, in, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status StreamsSum(const core::CpuExec& x, T* out, const T* in, int rows, int n,
                               int c) {
  cpu::StreamsSum(out, in, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status JoinStreams(const core::CpuExec& x, T* hyper, const T* const* parts, int rows,
                                int n, int c) {
  cpu::JoinStreams(hyper, parts, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status SplitStreams(const core::CpuExec& x, T* const* parts, const T* hyper, int rows,
                                 int n, int c) {
  cpu::SplitStreams(parts, hyper, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status HyperWidthForward(const core::CpuExec& x, T* u, const T* h,
                                      const HyperCoefs<T>& coefs, int rows, int n, int c) {
  cpu::HyperWidthForward(u, h, coefs, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status HyperDepthForward(const core::CpuExec& x, T* h_out, const T* h, const T* y,
                                      const HyperCoefs<T>& coefs, int rows, int n, int c) {
  cpu::HyperDepthForward(h_out, h, y, coefs, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status HyperDepthBackward(const core::CpuExec& x, T* dy, T* dh,
                                       const HyperCoefs<T>& dcoefs, const T* g, const T* y,
                                       const T* h, const HyperCoefs<T>& coefs, int rows, int n,
                                       int c) {
  cpu::HyperDepthBackward(dy, dh, dcoefs, g, y, h, coefs, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status HyperWidthBackward(const core::CpuExec& x, T* dh, const HyperCoefs<T>& dcoefs,
                                       const T* du, const T* h, const HyperCoefs<T>& coefs,
                                       int rows, int n, int c) {
  cpu::HyperWidthBackward(dh, dcoefs, du, h, coefs, rows, n, c, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status HcCoefForward(const core::CpuExec& x, T* coef, T* ta, int lda, T* tb, int ldb,
                                  const T* static_alpha, const T* static_beta, const T* alpha_scale,
                                  const T* beta_scale, int rows, int n) {
  cpu::HcCoefForward(coef, ta, lda, tb, ldb, static_alpha, static_beta, alpha_scale, beta_scale,
                     rows, n, x.pool);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status HcCoefBackward(const core::CpuExec& x, T* dta, T* dtb, T* grad_static_alpha,
                                   T* grad_static_beta, T* grad_alpha_scale, T* grad_beta_scale,
                                   const T* dcoef, const T* ta, int lda, const T* tb, int ldb,
                                   const T* alpha_scale, const T* beta_scale, int rows, int n) {
  cpu::HcCoefBackward(dta, dtb, grad_static_alpha, grad_static_beta, grad_alpha_scale,
                      grad_beta_scale, dcoef, ta, lda, tb, ldb, alpha_scale, beta_scale, rows, n,
                      x.pool);
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::HcCoefBackward;
using cuda::HcCoefForward;
using cuda::HyperDepthBackward;
using cuda::HyperDepthForward;
using cuda::HyperWidthBackward;
using cuda::HyperWidthForward;
using cuda::JoinStreams;
using cuda::MhcCoefBackward;
using cuda::MhcCoefForward;
using cuda::MhcRms;
using cuda::SinkhornBackward;
using cuda::SinkhornForward;
using cuda::SplitStreams;
using cuda::StreamsBroadcast;
using cuda::StreamsSum;
#endif

}  // namespace ops

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_HYPER_OPS_H_
