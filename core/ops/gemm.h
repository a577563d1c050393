// core/ops/gemm.h: row-major GEMM on the CPU over OpenBLAS, split across the thread pool.
//
//   C(M,N) = alpha * op(A) op(B) + beta * C,  op(X) = X or X^T
//
// OpenBLAS itself runs single-threaded (SetBlasThreads(1) at startup); parallelism comes from
// cutting C into row (or column) slabs, one per pool thread.
#ifndef SATDAR_CORE_OPS_GEMM_H_
#define SATDAR_CORE_OPS_GEMM_H_

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// Makes OpenBLAS single-threaded; call once before any GEMM.
void InitBlas();

template <typename T>
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
          const T* b, int ldb, T beta, T* c, int ldc);

template <typename T>
void ParallelGemm(ThreadPool* pool, bool trans_a, bool trans_b, int m, int n, int k, T alpha,
                  const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_GEMM_H_
