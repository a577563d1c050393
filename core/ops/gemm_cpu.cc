#include <cblas.h>

#include "core/ops/gemm.h"

namespace satdar::core::cpu {

void InitBlas() { openblas_set_num_threads(1); }

template <>
void Gemm<float>(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <>
void Gemm<double>(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                  int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void ParallelGemm(ThreadPool* pool, bool trans_a, bool trans_b, int m, int n, int k, T alpha,
                  const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc) {
  if (m == 0 || n == 0) return;
  const int64_t kMinSlab = 16;
  if (m >= n) {
    // Row slabs of C: rows of op(A).
    pool->ParallelFor(
        m,
        [&](int64_t r0, int64_t r1) {
          const T* a0 = trans_a ? a + r0 : a + r0 * lda;
          Gemm<T>(trans_a, trans_b, static_cast<int>(r1 - r0), n, k, alpha, a0, lda, b, ldb, beta,
                  c + r0 * ldc, ldc);
        },
        kMinSlab);
  } else {
    // Column slabs of C: columns of op(B).
    pool->ParallelFor(
        n,
        [&](int64_t c0, int64_t c1) {
          const T* b0 = trans_b ? b + c0 * ldb : b + c0;
          Gemm<T>(trans_a, trans_b, m, static_cast<int>(c1 - c0), k, alpha, a, lda, b0, ldb, beta,
                  c + c0, ldc);
        },
        kMinSlab);
  }
}

template void ParallelGemm<float>(ThreadPool*, bool, bool, int, int, int, float, const float*, int,
                                  const float*, int, float, float*, int);
template void ParallelGemm<double>(ThreadPool*, bool, bool, int, int, int, double, const double*,
                                   int, const double*, int, double, double*, int);

}  // namespace satdar::core::cpu
