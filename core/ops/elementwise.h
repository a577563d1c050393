// core/ops/elementwise.h: the copies and adds between activation buffers that a model's classes
// do besides their ops (docs/ONE_MODEL_PLAN.md, S5), one name for both devices like ops.h:
//
//   SATDAR_RETURN_IF_ERROR(ops::Add(x, out, a, b, n));
//
// n elements each. The CPU side is inline (copies and fills on the calling thread as
// std::copy/std::fill did; adds split over x.pool in chunks of kElementwiseGrain, bit-identical
// whatever the thread count); the CUDA side (elementwise_cuda.cu, T float or __nv_bfloat16,
// fp32 arithmetic) is enqueued on x.stream.
#ifndef SATDAR_CORE_OPS_ELEMENTWISE_H_
#define SATDAR_CORE_OPS_ELEMENTWISE_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "core/exec.h"
#include "core/thread_pool.h"

namespace satdar::core {

inline constexpr int64_t kElementwiseGrain = 4096;

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
namespace cuda {
// dst = src (device to device; dst and src do not overlap unless equal).
template <typename T>
absl::Status Copy(const CudaExec& x, T* dst, const T* src, int64_t n);
// dst = 0.
template <typename T>
absl::Status Zero(const CudaExec& x, T* dst, int64_t n);
// out = a + b (out may alias a or b).
template <typename T>
absl::Status Add(const CudaExec& x, T* out, const T* a, const T* b, int64_t n);
// out += a.
template <typename T>
absl::Status AddTo(const CudaExec& x, T* out, const T* a, int64_t n);
}  // namespace cuda
#endif  // SATDAR_WITH_CUDA || __CUDACC__

namespace ops {

template <typename T>
inline absl::Status Copy(const CpuExec& x, T* dst, const T* src, int64_t n) {
  (void)x;
  if (dst != src) std::copy(src, src + n, dst);
  return absl::OkStatus();
}
template <typename T>
inline absl::Status Zero(const CpuExec& x, T* dst, int64_t n) {
  (void)x;
  std::fill(dst, dst + n, T(0));
  return absl::OkStatus();
}
template <typename T>
inline absl::Status Add(const CpuExec& x, T* out, const T* a, const T* b, int64_t n) {
  auto body = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  };
  if (x.pool == nullptr) {
    body(0, n);
  } else {
    x.pool->ParallelFor(n, body, kElementwiseGrain);
  }
  return absl::OkStatus();
}
template <typename T>
inline absl::Status AddTo(const CpuExec& x, T* out, const T* a, int64_t n) {
  auto body = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] += a[i];
  };
  if (x.pool == nullptr) {
    body(0, n);
  } else {
    x.pool->ParallelFor(n, body, kElementwiseGrain);
  }
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::Add;
using cuda::AddTo;
using cuda::Copy;
using cuda::Zero;
#endif

}  // namespace ops
}  // namespace satdar::core

#endif  // SATDAR_CORE_OPS_ELEMENTWISE_H_
