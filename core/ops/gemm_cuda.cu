// cuBLASLt GEMM: row-major problems mapped onto column-major cuBLASLt, algorithms chosen by
// the heuristic once per problem and cached in the handle.
//
// Row-major C (M,N) is column-major C^T (N,M), and C^T = op(B)^T op(A)^T, so every call is
// the column-major product with the operands swapped: A' = B (rows N), B' = A (columns M).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/ops/gemm_cuda.h"

#define SATDAR_CUBLAS_RETURN_IF_ERROR(call) \
  SATDAR_GPU_RETURN_IF_ERROR(call, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString)

namespace satdar::core::cuda {

namespace {

using namespace ::satdar::core::cuda::device;

// C (M rows of N, row pitch ldc) *= beta: a GEMM with k == 0 (an empty sum).
template <typename T>
__global__ void ScaleMatrix(T* c, int m, int n, int ldc, float beta) {
  const int64_t total = static_cast<int64_t>(m) * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T* p = c + (i / n) * ldc + i % n;
    St(p, beta * Ld(p));
  }
}

// Largest power of two (at most 256) dividing the address: the heuristic must only choose
// kernels whose alignment assumptions hold for these pointers.
int Alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % a) != 0) a /= 2;
  return a;
}

using Key = std::tuple<int, bool, bool, int, int, int, int, int, int, int, int, int, bool>;

// cuBLASLt descriptors of one problem, destroyed with it.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

struct GemmHandle::Impl {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  std::map<Key, cublasLtMatmulAlgo_t> algos;

  ~Impl() {
    if (workspace) cudaFree(workspace);
    if (lt) cublasLtDestroy(lt);
  }
};

GemmHandle::GemmHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmHandle::~GemmHandle() = default;

absl::StatusOr<std::unique_ptr<GemmHandle>> GemmHandle::Create(CUstream_st* stream,
                                                              size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->lt));
  if (workspace_bytes > 0) {
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->workspace, workspace_bytes));
  }
  impl->workspace_bytes = workspace_bytes;
  impl->stream = stream;
  return std::unique_ptr<GemmHandle>(new GemmHandle(std::move(impl)));
}

void GemmHandle::SetStream(CUstream_st* stream) { impl_->stream = stream; }
CUstream_st* GemmHandle::stream() const { return impl_->stream; }
size_t GemmHandle::CachedAlgorithms() const { return impl_->algos.size(); }

absl::Status GemmHandle::Gemm(DType dtype, bool trans_a, bool trans_b, int m, int n, int k,
                              float alpha, const void* a, int lda, const void* b, int ldb,
                              float beta, void* c, int ldc) {
  return GemmMixed(dtype, dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

absl::Status GemmHandle::GemmMixed(DType ab_dtype, DType c_dtype, bool trans_a, bool trans_b,
                                   int m, int n, int k, float alpha, const void* a, int lda,
                                   const void* b, int ldb, float beta, void* c, int ldc) {
  const DType dtype = c_dtype;
  for (DType t : {ab_dtype, c_dtype}) {
    if (t != DType::kF32 && t != DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat("cuda::Gemm: dtype ", DTypeName(t),
                                                     " is not supported (f32 or bf16)"));
    }
  }
  if (ab_dtype == DType::kF32 && c_dtype == DType::kBF16) {
    return absl::InvalidArgumentError("cuda::Gemm: f32 inputs with a bf16 output");
  }
  if (m < 0 || n < 0 || k < 0) return absl::InvalidArgumentError("cuda::Gemm: negative size");
  if (m == 0 || n == 0) return absl::OkStatus();
  const size_t es = DTypeSize(dtype);
  if (k == 0) {
    if (beta == 1.0f) return absl::OkStatus();
    if (beta == 0.0f) {
      SATDAR_CUDA_RETURN_IF_ERROR(
          cudaMemset2DAsync(c, static_cast<size_t>(ldc) * es, 0, n * es, m, impl_->stream));
      return absl::OkStatus();
    }
    const int64_t total = static_cast<int64_t>(m) * n;
    const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
    if (dtype == DType::kF32) {
      SATDAR_CUDA_RETURN_IF_ERROR(Launch("ScaleMatrix", ScaleMatrix<float>, dim3(blocks),
                                         dim3(256), 0, impl_->stream, static_cast<float*>(c), m,
                                         n, ldc, beta));
    } else {
      SATDAR_CUDA_RETURN_IF_ERROR(Launch("ScaleMatrix", ScaleMatrix<__nv_bfloat16>, dim3(blocks),
                                         dim3(256), 0, impl_->stream,
                                         static_cast<__nv_bfloat16*>(c), m, n, ldc, beta));
    }
    return absl::OkStatus();
  }
  const cudaDataType_t type = ab_dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType_t c_type = c_dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  // Column-major view (see the top of the file): C' (N,M) = op(A') op(B'), A' = B, B' = A.
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t a_rows = trans_b ? k : n, a_cols = trans_b ? n : k;
  const uint64_t b_rows = trans_a ? m : k, b_cols = trans_a ? k : m;
  Descs d;
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.a, type, a_rows, a_cols, ldb));
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.b, type, b_rows, b_cols, lda));
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.c, c_type, n, m, ldc));

  const int align_a = Alignment(b), align_b = Alignment(a), align_c = Alignment(c);
  const Key key{static_cast<int>(ab_dtype) * 16 + static_cast<int>(c_dtype), trans_a, trans_b, m, n, k, lda, ldb, ldc,
                align_a, align_b, align_c, beta != 0.0f};
  auto it = impl_->algos.find(key);
  if (it == impl_->algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const uint32_t aa = align_a, ab = align_b, ac = align_c;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &impl_->workspace_bytes,
        sizeof(impl_->workspace_bytes));
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &aa, sizeof(aa));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &ab, sizeof(ab));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &ac, sizeof(ac));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &ac, sizeof(ac));
    }
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulAlgoGetHeuristic(impl_->lt, d.op, d.a, d.b, d.c, d.c, pref, 1, &result,
                                          &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    SATDAR_CUBLAS_RETURN_IF_ERROR(st);
    if (found == 0) {
      return absl::NotFoundError(absl::StrCat("cuBLASLt has no algorithm for ", DTypeName(dtype),
                                              " GEMM m=", m, " n=", n, " k=", k));
    }
    it = impl_->algos.emplace(key, result.algo).first;
  }
  SATDAR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(impl_->lt, d.op, &alpha, b, d.a, a, d.b, &beta, c,
                                               d.c, c, d.c, &it->second, impl_->workspace,
                                               impl_->workspace_bytes, impl_->stream));
  return absl::OkStatus();
}

namespace {
// The FailedPrecondition of an op called without a GEMM handle.
absl::Status NoGemm(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": the CudaExec has no GEMM handle"));
}

template <typename T>
constexpr DType GemmDType() {
  return std::is_same_v<T, float> ? DType::kF32 : DType::kBF16;
}
}  // namespace

absl::Status MatmulForward(const CudaExec& x, DType dtype, void* out, const void* inp,
                           const void* weight, int m, int n, int k) {
  if (x.gemm == nullptr) return NoGemm("MatmulForward");
  return x.gemm->Gemm(dtype, false, true, m, n, k, 1.0f, inp, k, weight, k, 0.0f, out, n);
}

absl::Status MatmulBackward(const CudaExec& x, DType dtype, void* dinp, void* dweight,
                            const void* dout, const void* inp, const void* weight, int m, int n,
                            int k) {
  if (x.gemm == nullptr) return NoGemm("MatmulBackward");
  if (dinp != nullptr) {
    absl::Status s =
        x.gemm->Gemm(dtype, false, false, m, k, n, 1.0f, dout, n, weight, k, 1.0f, dinp, k);
    if (!s.ok()) return s;
  }
  if (dweight != nullptr) {
    return x.gemm->Gemm(dtype, true, false, n, k, m, 1.0f, dout, n, inp, k, 1.0f, dweight, k);
  }
  return absl::OkStatus();
}

absl::Status MatmulBackwardInput(const CudaExec& x, DType dtype, void* dinp, const void* dout,
                                 const void* weight, int m, int n, int k, float beta) {
  if (x.gemm == nullptr) return NoGemm("MatmulBackwardInput");
  return x.gemm->Gemm(dtype, false, false, m, k, n, 1.0f, dout, n, weight, k, beta, dinp, k);
}

absl::Status MatmulBackwardWeightF32(const CudaExec& x, DType dtype, float* dweight,
                                     const void* dout, const void* inp, int m, int n, int k) {
  if (x.gemm == nullptr) return NoGemm("MatmulBackwardWeightF32");
  return x.gemm->GemmMixed(dtype, DType::kF32, true, false, n, k, m, 1.0f, dout, n, inp, k, 1.0f,
                           dweight, k);
}

absl::Status GroupedMatmulForward(const CudaExec& x, DType dtype, void* out, const void* inp,
                                  const void* const* weights, const int* rows, int groups, int n,
                                  int k) {
  const size_t es = DTypeSize(dtype);
  size_t r0 = 0;
  for (int g = 0; g < groups; ++g) {
    if (rows[g] > 0) {
      absl::Status s =
          MatmulForward(x, dtype, static_cast<char*>(out) + r0 * n * es,
                        static_cast<const char*>(inp) + r0 * k * es, weights[g], rows[g], n, k);
      if (!s.ok()) return s;
    }
    r0 += rows[g];
  }
  return absl::OkStatus();
}

absl::Status GroupedMatmulBackward(const CudaExec& x, DType dtype, void* dinp,
                                   void* const* dweights, const void* dout, const void* inp,
                                   const void* const* weights, const int* rows, int groups, int n,
                                   int k) {
  const size_t es = DTypeSize(dtype);
  size_t r0 = 0;
  for (int g = 0; g < groups; ++g) {
    if (rows[g] > 0) {
      absl::Status s = MatmulBackward(
          x, dtype, dinp == nullptr ? nullptr : static_cast<char*>(dinp) + r0 * k * es,
          dweights == nullptr ? nullptr : dweights[g], static_cast<const char*>(dout) + r0 * n * es,
          static_cast<const char*>(inp) + r0 * k * es, weights[g], rows[g], n, k);
      if (!s.ok()) return s;
    }
    r0 += rows[g];
  }
  return absl::OkStatus();
}

absl::Status GroupedMatmulBackwardF32(const CudaExec& x, DType dtype, void* dinp,
                                      float* const* dweights, const void* dout, const void* inp,
                                      const void* const* weights, const int* rows, int groups,
                                      int n, int k) {
  const size_t es = DTypeSize(dtype);
  size_t r0 = 0;
  for (int g = 0; g < groups; ++g) {
    if (rows[g] > 0) {
      const char* dout_g = static_cast<const char*>(dout) + r0 * n * es;
      absl::Status s = MatmulBackwardInput(x, dtype, static_cast<char*>(dinp) + r0 * k * es, dout_g,
                                           weights[g], rows[g], n, k, 0.0f);
      if (!s.ok()) return s;
      s = MatmulBackwardWeightF32(x, dtype, dweights[g], dout_g,
                                  static_cast<const char*>(inp) + r0 * k * es, rows[g], n, k);
      if (!s.ok()) return s;
    }
    r0 += rows[g];
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status MatmulForward(const CudaExec& x, T* out, const T* inp, const T* weight, int m, int n,
                           int k) {
  return MatmulForward(x, GemmDType<T>(), out, inp, weight, m, n, k);
}

template <typename T>
absl::Status MatmulBackward(const CudaExec& x, T* dinp, T* dweight, const T* dout, const T* inp,
                            const T* weight, int m, int n, int k) {
  return MatmulBackward(x, GemmDType<T>(), dinp, dweight, dout, inp, weight, m, n, k);
}

template <typename T>
absl::Status MatmulBackwardInput(const CudaExec& x, T* dinp, const T* dout, const T* weight, int m,
                                 int n, int k, float beta) {
  return MatmulBackwardInput(x, GemmDType<T>(), dinp, dout, weight, m, n, k, beta);
}

template <typename T>
absl::Status MatmulBackwardWeightF32(const CudaExec& x, float* dweight, const T* dout, const T* inp,
                                     int m, int n, int k) {
  return MatmulBackwardWeightF32(x, GemmDType<T>(), dweight, dout, inp, m, n, k);
}

#define SATDAR_INSTANTIATE(T)                                                                     \
  template absl::Status MatmulForward<T>(const CudaExec&, T*, const T*, const T*, int, int, int); \
  template absl::Status MatmulBackward<T>(const CudaExec&, T*, T*, const T*, const T*, const T*,  \
                                          int, int, int);                                         \
  template absl::Status MatmulBackwardInput<T>(const CudaExec&, T*, const T*, const T*, int, int, \
                                               int, float);                                       \
  template absl::Status MatmulBackwardWeightF32<T>(const CudaExec&, float*, const T*, const T*,   \
                                                   int, int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
