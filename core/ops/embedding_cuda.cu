// CUDA embedding lookup and its backward (see embedding.h and embedding_cpu.cc).
// Backward, sort-free and deterministic: block (x, y) owns kBlockSize columns of the table rows
// whose token is congruent to y mod kClasses. Every thread walks the whole token list in order
// and adds the gradients of its class's tokens to its column, so no two threads ever write the
// same element, and each element of dtable receives its additions in token order, as on the
// CPU. The token list is small and read by every thread of a warp at once (a broadcast).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/cuda/bf16.cuh"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/exec.h"
#include "core/ops/cuda_ops.h"

namespace satdar::core::cuda {

namespace {
constexpr int kBlockSize = 256;
constexpr int kClasses = 64;  // token residue classes: parallelism beyond the C columns

using namespace ::satdar::core::cuda::device;  // ToF, FromF, Ld, St, WarpSum (bf16.cuh)

template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const T* table, int c,
                                       int64_t total) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t r = idx / c;
  const int j = static_cast<int>(idx % c);
  out[idx] = table[static_cast<int64_t>(tokens[r]) * c + j];
}

template <typename T>
__global__ void EmbeddingBackwardKernel(float* dtable, const T* dout, const int32_t* tokens, int n,
                                        int c) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t cls = blockIdx.y;
  if (j >= c) return;
  for (int i = 0; i < n; ++i) {
    const int32_t tok = tokens[i];
    if (static_cast<uint32_t>(tok) % kClasses != cls) continue;
    dtable[static_cast<int64_t>(tok) * c + j] += ToF(dout[static_cast<int64_t>(i) * c + j]);
  }
}
}  // namespace

template <typename T>
absl::Status EmbeddingForward(const CudaExec& x, T* out, const int32_t* tokens, const T* table,
                              int n, int c) {
  const int64_t total = static_cast<int64_t>(n) * c;
  if (total <= 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>((total + kBlockSize - 1) / kBlockSize);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("EmbeddingForwardKernel", EmbeddingForwardKernel<T>,
                                     dim3(blocks), dim3(kBlockSize), 0, x.stream, out, tokens,
                                     table, c, total));
  return absl::OkStatus();
}

template <typename T>
absl::Status EmbeddingBackward(const CudaExec& x, float* dtable, const T* dout,
                               const int32_t* tokens, int n, int c) {
  if (n <= 0 || c <= 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>((c + kBlockSize - 1) / kBlockSize), kClasses);
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("EmbeddingBackwardKernel", EmbeddingBackwardKernel<T>, grid,
                                     dim3(kBlockSize), 0, x.stream, dtable, dout, tokens, n, c));
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                      \
  template absl::Status EmbeddingForward<T>(const CudaExec&, T*, const int32_t*, const T*, int,    \
                                            int);                                                  \
  template absl::Status EmbeddingBackward<T>(const CudaExec&, float*, const T*, const int32_t*,    \
                                             int, int);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::core::cuda
