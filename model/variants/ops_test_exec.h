// model/variants/ops_test_exec.h: the two execution contexts the <design>_ops_test CUDA cases
// call ops:: with: the CPU on a pool, the GPU on the legacy default stream with a workspace
// over its own CachingAllocator (released when the OpsTestExec goes); and DeviceTestExec, what
// the layer and model tests on the device run with (a GEMM handle too, and the allocator the
// classes' DeviceVecs come from). CUDA builds only.
#ifndef SATDAR_MODEL_VARIANTS_OPS_TEST_EXEC_H_
#define SATDAR_MODEL_VARIANTS_OPS_TEST_EXEC_H_

#ifdef SATDAR_WITH_CUDA

#include <memory>
#include <utility>

#include "core/cuda/allocator.h"
#include "core/cuda/workspace.h"
#include "core/exec.h"
#include "core/ops/gemm_cuda.h"
#include "gtest/gtest.h"

namespace satdar::model {

struct OpsTestExec {
  explicit OpsTestExec(core::ThreadPool* pool) : cpu{pool}, gpu{nullptr, nullptr, &workspace} {}

  core::cuda::CachingAllocator alloc;
  core::cuda::Workspace workspace{&alloc, nullptr};
  core::CpuExec cpu;
  core::CudaExec gpu;
};

// The legacy default stream, a GEMM handle on it, a workspace and the allocator device buffers
// come from. gemm is null (with a test failure) when no handle could be made.
struct DeviceTestExec {
  DeviceTestExec() {
    auto h = core::cuda::GemmHandle::Create();
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) gemm = std::move(*h);
    x = core::CudaExec{nullptr, gemm.get(), &workspace, &alloc};
  }
  core::cuda::CachingAllocator alloc;
  core::cuda::Workspace workspace{&alloc, nullptr};
  std::unique_ptr<core::cuda::GemmHandle> gemm;
  core::CudaExec x;
};

}  // namespace satdar::model

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_VARIANTS_OPS_TEST_EXEC_H_
