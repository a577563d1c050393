// core/ops/elementwise.h: the copies and adds between activation buffers that a model's classes
// do besides their ops (docs/ONE_MODEL_PLAN.md, S5), one name for both devices like ops.h:
//
//   SATDAR_RETURN_IF_ERROR(ops::Add(x, out, a, b, n));
//
// Upload and Download move n elements between host memory and x's buffers. Besides them, what
// a trainer does to whole buffers: CastFromF32 (the compute copy of fp32 master weights),
// AccumulateSum / AccumulateValue (a running fp64 total in x's memory, e.g. the mean loss),
// AccumulateColumns (per-column fp64 sums and zero counts: the designs' statistics) and
// SumSquares (the gradient norm's fp64 sum of squares).
// Each takes n elements (AccumulateColumns a rows x cols matrix). The CPU side is inline
// (copies and fills on the calling thread as std::copy/std::fill did; adds split over x.pool in chunks of kElementwiseGrain, bit-identical
// whatever the thread count; the fp64 sums serially in index order); the CUDA side
// (elementwise_cuda.cu, T float or __nv_bfloat16, fp32 arithmetic, fp64 sums in a fixed order
// so they are bit-identical run to run) is enqueued on x.stream.
#ifndef SATDAR_CORE_OPS_ELEMENTWISE_H_
#define SATDAR_CORE_OPS_ELEMENTWISE_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

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
// Waits until every op enqueued on x.stream has finished (before a communicator or the host
// reads what they wrote without an event).
absl::Status Synchronize(const CudaExec& x);
// v *= s, and v /= d (in fp32, rounded to T).
template <typename T>
absl::Status Scale(const CudaExec& x, T* v, int64_t n, double s);
template <typename T>
absl::Status Divide(const CudaExec& x, T* v, int64_t n, double d);
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
// out = in rounded to T (nearest even for bf16): the compute copy of fp32 master weights.
template <typename T>
absl::Status CastFromF32(const CudaExec& x, T* out, const float* in, int64_t n);
// *acc (fp64, device) += scale * (sum of v[0..n)); the sum in fp64 by one block in a fixed
// order (bit-identical run to run).
absl::Status AccumulateSum(const CudaExec& x, double* acc, const float* v, int64_t n,
                           double scale);
// *acc (fp64, device) += value: one tiny kernel, so the host never waits for the stream.
absl::Status AccumulateValue(const CudaExec& x, double* acc, double value);
// *out (fp64, device) = sum of v[i]^2 over [0, n), n = 0 included (0). A grid of
// ReduceBlocks(n) blocks (core/cuda/reduce_grid.h), then one block adds their sums in block
// order. Scratch: that many doubles from x.workspace (FailedPrecondition when it is null).
absl::Status SumSquares(const CudaExec& x, double* out, const float* v, int64_t n);
// Column statistics of a (rows, cols) row-major fp32 matrix into fp64 accumulators in device
// memory: sums[c] += sum over r of a[r, c], and when zeros is not null zeros[c] += the count
// of a[r, c] == 0. One block per column, each sum in a fixed order (bit-identical run to
// run), no host wait: the per-layer statistics stay on the device until they are read.
absl::Status AccumulateColumns(const CudaExec& x, double* sums, double* zeros, const float* a,
                               int64_t rows, int cols);
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

// The CPU's ops have finished when they return.
inline absl::Status Synchronize(const CpuExec& x) {
  (void)x;
  return absl::OkStatus();
}

// v *= T(s), and v /= T(d) (a division, not a product with 1/d: the bits of the CPU's
// gradient scalings).
template <typename T>
inline absl::Status Scale(const CpuExec& x, T* v, int64_t n, double s) {
  (void)x;
  const T f = static_cast<T>(s);
  for (int64_t i = 0; i < n; ++i) v[i] *= f;
  return absl::OkStatus();
}
template <typename T>
inline absl::Status Divide(const CpuExec& x, T* v, int64_t n, double d) {
  (void)x;
  const T f = static_cast<T>(d);
  for (int64_t i = 0; i < n; ++i) v[i] /= f;
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

// out = in converted to T (float or double, the CPU backends' element types).
template <typename T>
inline absl::Status CastFromF32(const CpuExec& x, T* out, const float* in, int64_t n) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "float or double");
  (void)x;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(in[i]);
  return absl::OkStatus();
}
// *acc += scale * (sum of v[0..n)), the sum in double in index order.
template <typename T>
inline absl::Status AccumulateSum(const CpuExec& x, double* acc, const T* v, int64_t n,
                                  double scale) {
  (void)x;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(v[i]);
  *acc += scale * sum;
  return absl::OkStatus();
}
inline absl::Status AccumulateValue(const CpuExec& x, double* acc, double value) {
  (void)x;
  *acc += value;
  return absl::OkStatus();
}
// sums[c] += a[r, c] and zeros[c] += (a[r, c] == 0) (zeros may be null) over the (rows, cols)
// row-major matrix a, in double in index order (row by row).
template <typename T>
inline absl::Status AccumulateColumns(const CpuExec& x, double* sums, double* zeros, const T* a,
                                      int64_t rows, int cols) {
  (void)x;
  const int64_t n = rows * cols;
  for (int64_t j = 0; j < n; ++j) {
    sums[j % cols] += a[j];
    if (zeros != nullptr) zeros[j % cols] += a[j] == T(0);
  }
  return absl::OkStatus();
}
// *out = sum of v[i]^2 over [0, n), in double in index order.
template <typename T>
inline absl::Status SumSquares(const CpuExec& x, double* out, const T* v, int64_t n) {
  (void)x;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(v[i]);
    sum += e * e;
  }
  *out = sum;
  return absl::OkStatus();
}

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
using cuda::AccumulateColumns;
using cuda::AccumulateSum;
using cuda::AccumulateValue;
using cuda::Add;
using cuda::AddTo;
using cuda::CastFromF32;
using cuda::Copy;
using cuda::Divide;
using cuda::Download;
using cuda::Scale;
using cuda::SumSquares;
using cuda::Synchronize;
using cuda::Upload;
using cuda::Zero;
#endif

}  // namespace ops
}  // namespace satdar::core

#endif  // SATDAR_CORE_OPS_ELEMENTWISE_H_
