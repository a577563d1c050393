// model/variants/hyper_cuda.h: the CUDA kernels of the n-stream residuals, Hyper-Connections
// (model/variants/hyper_connections.cc) and mHC (model/variants/mhc.cc); the CPU code there is
// the reference. The hyper state H is stored as on the CPU, (N, n, C) interleaved: token r,
// stream j at (r*n + j)*C.
//
// Per token the residual is a width connection u = sum_j pre_j H_j, the branch y = f(u), and a
// depth connection H'_m = post_m y + sum_j res_jm H_j. The coefficients are fp32 and differ by
// design (HC: static + scale * tanh of a projection of RMSNorm(H_j); mHC: sigmoids and a
// Sinkhorn matrix from a projection of the whole vec(H)); HyperCoefs says where they lie, so
// the mixing kernels serve both. The projections themselves are cuBLASLt GEMMs (the caller's).
//
// T is float or __nv_bfloat16; arithmetic and every reduction are fp32 in a fixed order (no
// atomics): results are bit-identical run to run. Per-token kernels run one block per token.
// n <= kMaxHyperStreams (larger n returns cudaErrorInvalidValue). Device pointers; enqueued
// on `stream`; each returns the launch's cudaError_t. Declared only in CUDA builds; tested
// by //model:residual_mixing_cuda_test (tag gpu) and the whole models in
// //model/gpu:gpu_model_test.
#ifndef SATDAR_MODEL_VARIANTS_HYPER_CUDA_H_
#define SATDAR_MODEL_VARIANTS_HYPER_CUDA_H_

namespace satdar::model::cuda {
constexpr int kMaxHyperStreams = 8;  // also checked by CheckGpuSupport (any build)
}  // namespace satdar::model::cuda

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstdint>

namespace satdar::model::cuda {

// Where token r's coefficients lie: pre_j = pre[r*pre_token + j*pre_step],
// post_m = post[r*post_token + m], res_jm = res[r*res_token + j*res_row + m].
struct HyperCoefs {
  float* pre = nullptr;
  float* post = nullptr;
  float* res = nullptr;
  int64_t pre_token = 0, pre_step = 1, post_token = 0, res_token = 0, res_row = 0;
};

// Entry and exit (hyper_streams.h): out (N, n, C) = in (N, C) in every stream (EnterStreams,
// ExitStreamsBackward); out (N, C) = sum over the n streams of in (N, n, C) (ExitStreams,
// EnterStreamsBackward).
template <typename T>
cudaError_t StreamsBroadcast(T* out, const T* in, int rows, int n, int c, cudaStream_t stream);
template <typename T>
cudaError_t StreamsSum(T* out, const T* in, int rows, int n, int c, cudaStream_t stream);

// u (N, C) = sum_j pre_j H_j.
template <typename T>
cudaError_t HyperWidthForward(T* u, const T* h, const HyperCoefs& coefs, int rows, int n, int c,
                              cudaStream_t stream);
// h_out (N, n, C): stream m = post_m y + sum_j res_jm H_j (h_out must not alias h).
template <typename T>
cudaError_t HyperDepthForward(T* h_out, const T* h, const T* y, const HyperCoefs& coefs,
                              int rows, int n, int c, cudaStream_t stream);
// From g (N, n, C), the gradient of h_out: dy = sum_m post_m g_m and dh_j = sum_m res_jm g_m
// (both overwritten); dcoefs' post_m = <y, g_m> and res_jm = <H_j, g_m> (written).
template <typename T>
cudaError_t HyperDepthBackward(T* dy, T* dh, const HyperCoefs& dcoefs, const T* g, const T* y,
                               const T* h, const HyperCoefs& coefs, int rows, int n, int c,
                               cudaStream_t stream);
// From du (N, C), the gradient of u: dh_j += pre_j du; dcoefs' pre_j = <H_j, du> (written).
template <typename T>
cudaError_t HyperWidthBackward(T* dh, const HyperCoefs& dcoefs, const T* du, const T* h,
                               const HyperCoefs& coefs, int rows, int n, int c,
                               cudaStream_t stream);

// out[k] += sum over rows r of in[r*ld + k], k < cols (fp32; one block per column, a fixed
// partition of the rows and a fixed tree: deterministic).
cudaError_t ColumnSums(float* out, const float* in, int rows, int cols, int ld,
                       cudaStream_t stream);

// ---- HC. proj (N*n, ld) fp32: row (r, j) holds RMSNorm(H_j) . dynamic_alpha (n+1 columns)
// then . dynamic_beta (1 column); replaced in place by its tanh. coef (N, n(n+2)) gets, per
// token, static_alpha + alpha_scale * tanh (the (n, n+1) matrix [pre_j | res_j.]) then
// static_beta + beta_scale * tanh (post), i.e. HcCoefs(coef, n). The parameters are the fp32
// master weights.
struct HcParams {
  const float* static_alpha = nullptr;  // (n, n+1)
  const float* static_beta = nullptr;   // (n)
  const float* alpha_scale = nullptr;   // [1]
  const float* beta_scale = nullptr;    // [1]
};
HyperCoefs HcCoefs(float* coef, int n);
cudaError_t HcCoefForward(float* coef, float* proj, int ld, const HcParams& p, int rows, int n,
                          cudaStream_t stream);
// dcoef (N, n(n+2)) in HcCoefs' layout (the mixing backward's output) -> dproj (N*n, ld) of T:
// the gradient before the tanh, times the scale (padding columns 0); scales (N, 2) fp32: per
// token sum dalpha * tanh and sum dbeta * tanh (ColumnSums them into the scales' gradients;
// the static gradients are ColumnSums of dcoef).
template <typename T>
cudaError_t HcCoefBackward(T* dproj, float* scales, const float* dcoef, const float* tanh_proj,
                           int ld, const HcParams& p, int rows, int n, cudaStream_t stream);

// mHC's coefficients (RMS of vec(H), sigmoids, Sinkhorn) and their backward: hyper_ops.h.

}  // namespace satdar::model::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_MODEL_VARIANTS_HYPER_CUDA_H_
