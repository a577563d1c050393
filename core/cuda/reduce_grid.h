// core/cuda/reduce_grid.h: the one fixed grid of the deterministic reductions (a grid-stride
// pass over ReduceBlocks(n) <= kReduceBlocks blocks, then one block adding their sums in block
// order), shared by the kernels and by the host code that sizes their scratch buffers. Plain
// C++ (no CUDA headers), so CPU-only builds may include it.
#ifndef SATDAR_CORE_CUDA_REDUCE_GRID_H_
#define SATDAR_CORE_CUDA_REDUCE_GRID_H_

#include <cstdint>

namespace satdar::core::cuda {

// The most blocks of a reduction grid, and the scratch (per reduced value) it needs.
constexpr int kReduceBlocks = 240;

// The blocks of the reduction grid over n elements at `threads` per block: kReduceBlocks, or
// as many as cover n when fewer do (a 4 x 32 x 64 activation needs 32 blocks, not 240 with 208
// idle). It depends on n alone, so results stay bit-identical run to run.
constexpr int ReduceBlocks(int64_t n, int threads) {
  const int64_t cover = (n + threads - 1) / threads;
  return cover < 1 ? 1 : cover < kReduceBlocks ? static_cast<int>(cover) : kReduceBlocks;
}

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_CUDA_REDUCE_GRID_H_
