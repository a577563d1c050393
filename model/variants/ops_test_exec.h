// model/variants/ops_test_exec.h: the two execution contexts the <design>_ops_test CUDA cases
// call ops:: with: the CPU on a pool, the GPU on the legacy default stream with a workspace
// over its own CachingAllocator (released when the OpsTestExec goes). CUDA builds only.
#ifndef SATDAR_MODEL_VARIANTS_OPS_TEST_EXEC_H_
#define SATDAR_MODEL_VARIANTS_OPS_TEST_EXEC_H_

#ifdef SATDAR_WITH_CUDA

#include "core/cuda/allocator.h"
#include "core/cuda/workspace.h"
#include "core/exec.h"

namespace satdar::model {

struct OpsTestExec {
  explicit OpsTestExec(core::ThreadPool* pool) : cpu{pool}, gpu{nullptr, nullptr, &workspace} {}

  core::cuda::CachingAllocator alloc;
  core::cuda::Workspace workspace{&alloc, nullptr};
  core::CpuExec cpu;
  core::CudaExec gpu;
};

}  // namespace satdar::model

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_VARIANTS_OPS_TEST_EXEC_H_
