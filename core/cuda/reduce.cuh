// core/cuda/reduce.cuh: the launch-size and block-reduction helpers shared by the .cu kernels
// that walk flat arrays with a grid stride and sum per block in a fixed order (no atomics, so
// results are bit-identical run to run). Only for nvcc; pull the names in with
// `using namespace ::satdar::core::cuda::device;`.
#ifndef SATDAR_CORE_CUDA_REDUCE_CUH_
#define SATDAR_CORE_CUDA_REDUCE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace satdar::core::cuda::device {

// Blocks of `threads` threads for a grid-stride loop over n elements: at least 1, at most
// 65535.
inline int GridBlocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// Block-wide sums of K values per thread over a block of exactly kThreads threads (a
// power of two), in a fixed tree order; every thread gets the totals. Ends with a barrier, so
// it may be called again in the same kernel.
template <int kThreads, int K, typename A>
__device__ void BlockSums(A (&v)[K]) {
  __shared__ A sh[K][kThreads];
  for (int j = 0; j < K; ++j) sh[j][threadIdx.x] = v[j];
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      for (int j = 0; j < K; ++j) sh[j][threadIdx.x] += sh[j][threadIdx.x + s];
    }
    __syncthreads();
  }
  for (int j = 0; j < K; ++j) v[j] = sh[j][0];
  __syncthreads();
}

}  // namespace satdar::core::cuda::device

#endif  // SATDAR_CORE_CUDA_REDUCE_CUH_
