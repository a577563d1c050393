// core/ops/elementwise.h: the copies and adds between activation buffers that a model's classes
// do besides their ops (docs/ONE_MODEL_PLAN.md, S5), one name for both devices like ops.h:
//
//   SATDAR_RETURN_IF_ERROR(ops::Add(x, out, a, b, n));
//
// Upload and Download move n elements between host memory and x's buffers.
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
// dst (device) = src (host), enqueued on x.stream; src may be reused when it returns (a copy
// from pageable memory is staged before cudaMemcpyAsync returns). T float, __nv_bfloat16,
// int32_t or double.
template <typename T>
absl::Status Upload(const CudaExec& x, T* dst, const T* host_src, int64_t n);
// host_dst = src (device): waits for x.stream, so every op enqueued before it has finished
// and host_dst holds the values when it returns. The one way a model reads device values on
// the host. T float, __nv_bfloat16, int32_t or double.
template <typename T>
absl::Status Download(const CudaExec& x, T* host_dst, const T* src, int64_t n);
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

// Host memory to the buffers of x and back (on the CPU both are host memory: copies). A
// model's host state (token ids, the RoPE tables) goes in through Upload; what the host reads
// of its buffers (the losses, statistics) comes out through Download.
template <typename T>
inline absl::Status Upload(const CpuExec& x, T* dst, const T* host_src, int64_t n) {
  return Copy(x, dst, host_src, n);
}
template <typename T>
inline absl::Status Download(const CpuExec& x, T* host_dst, const T* src, int64_t n) {
  return Copy(x, host_dst, src, n);
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::Add;
using cuda::AddTo;
using cuda::Copy;
using cuda::Download;
using cuda::Upload;
using cuda::Zero;
#endif

}  // namespace ops
}  // namespace satdar::core

#endif  // SATDAR_CORE_OPS_ELEMENTWISE_H_
