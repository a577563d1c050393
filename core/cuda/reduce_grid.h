// core/cuda/reduce_grid.h: the one fixed grid of the deterministic reductions (a grid-stride
// pass over kReduceBlocks blocks, then one block adding their sums in block order), shared by
// the kernels and by the host code that sizes their scratch buffers. Plain C++ (no CUDA
// headers), so CPU-only builds may include it.
#ifndef SATDAR_CORE_CUDA_REDUCE_GRID_H_
#define SATDAR_CORE_CUDA_REDUCE_GRID_H_

namespace satdar::core::cuda {

constexpr int kReduceBlocks = 240;

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_CUDA_REDUCE_GRID_H_
