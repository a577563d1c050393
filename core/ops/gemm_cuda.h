// core/ops/gemm_cuda.h: GEMM and the linear layer on the GPU over cuBLASLt.
//
// Row-major throughout, like gemm.h / matmul.h:
//   C(M,N) = alpha * op(A) op(B) + beta * C,  op(X) = X or X^T
// A, B and C have one dtype, f32 or bf16; the accumulation is fp32 (CUBLAS_COMPUTE_32F, no
// TF32) and alpha/beta are fp32. Pointers are device pointers; every call is asynchronous on
// the handle's stream.
//
// A GemmHandle owns one cuBLASLt handle, one workspace and a cache of the heuristic's choice
// of algorithm per problem (dtype, transposes, sizes, leading dimensions, pointer alignment),
// so the heuristic runs once per shape. A handle serves one stream at a time (the workspace is
// shared by its calls): use one handle per stream. Not thread-safe.
#ifndef SATDAR_CORE_OPS_GEMM_CUDA_H_
#define SATDAR_CORE_OPS_GEMM_CUDA_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/exec.h"

struct CUstream_st;  // cudaStream_t

namespace satdar::core::cuda {

class GemmHandle {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  // `stream` nullptr: the legacy default stream.
  static absl::StatusOr<std::unique_ptr<GemmHandle>> Create(
      CUstream_st* stream = nullptr, size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;

  void SetStream(CUstream_st* stream);
  CUstream_st* stream() const;
  // Number of distinct problems whose algorithm is cached.
  size_t CachedAlgorithms() const;

  // dtype: kF32 or kBF16. m, n or k may be 0 (k == 0 scales C by beta, beta 0 or 1 only).
  absl::Status Gemm(DType dtype, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const void* a, int lda, const void* b, int ldb, float beta, void* c, int ldc);

  // Mixed precision: A and B of ab_dtype, C of c_dtype (bf16 inputs with an f32 C, e.g. fp32
  // weight gradients accumulated from bf16 activations; f32 inputs with a bf16 C is refused).
  absl::Status GemmMixed(DType ab_dtype, DType c_dtype, bool trans_a, bool trans_b, int m, int n,
                         int k, float alpha, const void* a, int lda, const void* b, int ldb,
                         float beta, void* c, int ldc);

  struct Impl;

 private:
  explicit GemmHandle(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The linear layer and the grouped layers below take the execution context first
// (core/exec.h) and run on x.gemm, a handle bound to x.stream; without one they return
// FailedPrecondition naming the op. Each comes with a DType form over void pointers (the model's
// GPU code, which holds a runtime dtype, and the grouped layers use it) and, for the plain layer,
// a typed form (T = float or __nv_bfloat16, instantiated in gemm_cuda.cu) whose argument list is
// the CPU reference's of matmul.h minus the pool: ops::MatmulForward(x, out, inp, weight, m, n, k)
// in core/ops/ops.h is one call text for both devices.
//
// The linear layer of matmul.h: out (M,N) = inp (M,K) weight^T, weight (N,K). Overwrites out.
absl::Status MatmulForward(const CudaExec& x, DType dtype, void* out, const void* inp,
                           const void* weight, int m, int n, int k);
// dinp (M,K) += dout (M,N) weight (N,K); dweight (N,K) += dout^T inp. Either may be null.
absl::Status MatmulBackward(const CudaExec& x, DType dtype, void* dinp, void* dweight,
                            const void* dout, const void* inp, const void* weight, int m, int n,
                            int k);

// The two halves of MatmulBackward for mixed precision training:
// dinp (M,K) = dout (M,N) weight (N,K) + beta * dinp (beta 0 overwrites);
// dweight (N,K) fp32 += dout^T inp, with dout and inp of `dtype` (f32 or bf16).
absl::Status MatmulBackwardInput(const CudaExec& x, DType dtype, void* dinp, const void* dout,
                                 const void* weight, int m, int n, int k, float beta);
absl::Status MatmulBackwardWeightF32(const CudaExec& x, DType dtype, float* dweight,
                                     const void* dout, const void* inp, int m, int n, int k);

// Typed forms of the four above (T = float or __nv_bfloat16).
template <typename T>
absl::Status MatmulForward(const CudaExec& x, T* out, const T* inp, const T* weight, int m, int n,
                           int k);
template <typename T>
absl::Status MatmulBackward(const CudaExec& x, T* dinp, T* dweight, const T* dout, const T* inp,
                            const T* weight, int m, int n, int k);
template <typename T>
absl::Status MatmulBackwardInput(const CudaExec& x, T* dinp, const T* dout, const T* weight, int m,
                                 int n, int k, float beta);
template <typename T>
absl::Status MatmulBackwardWeightF32(const CudaExec& x, float* dweight, const T* dout, const T* inp,
                                     int m, int n, int k);

// Grouped linear layers (MoE experts): group g owns rows [r_g, r_g + rows[g]) of inp/out (rows
// are consecutive, r_0 = 0) and its own weight weights[g] (N,K). `rows` and `weights` are host
// arrays (the weights themselves on the device); empty groups are skipped. One cuBLASLt call
// per group.
absl::Status GroupedMatmulForward(const CudaExec& x, DType dtype, void* out, const void* inp,
                                  const void* const* weights, const int* rows, int groups, int n,
                                  int k);
// dinp += per group dout_g W_g; dweights[g] += dout_g^T inp_g. dinp or dweights may be null.
absl::Status GroupedMatmulBackward(const CudaExec& x, DType dtype, void* dinp,
                                   void* const* dweights, const void* dout, const void* inp,
                                   const void* const* weights, const int* rows, int groups, int n,
                                   int k);
// Mixed precision (as MatmulBackwardInput / MatmulBackwardWeightF32 per group): the groups'
// rows of dinp overwritten with dout_g W_g; fp32 dweights[g] += dout_g^T inp_g.
absl::Status GroupedMatmulBackwardF32(const CudaExec& x, DType dtype, void* dinp,
                                      float* const* dweights, const void* dout, const void* inp,
                                      const void* const* weights, const int* rows, int groups,
                                      int n, int k);

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_OPS_GEMM_CUDA_H_
