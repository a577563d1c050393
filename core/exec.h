// core/exec.h: where an op runs. The ops of core/ops and of model/variants/<design>_ops.h take
// one of these first, the CPU reference a CpuExec and the CUDA launcher a CudaExec, so one name
// and one argument list serve both devices and the overload is chosen at compile time
// (docs/ONE_MODEL_PLAN.md, S3):
//
//   SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x, out, rstd, inp, weight, n, c, eps));
//
// with x a CpuExec (rows split over its pool) or a CudaExec (enqueued on its stream, GEMMs on
// its handle, scratch from its workspace). Both are a few pointers, declared in every build:
// a CPU-only build can name CudaExec but has no op that takes it.
#ifndef SATDAR_CORE_EXEC_H_
#define SATDAR_CORE_EXEC_H_

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace satdar::core {

class ThreadPool;

namespace cuda {
class CachingAllocator;
class GemmHandle;
class Workspace;
}  // namespace cuda

// The CPU: an op splits its rows over `pool`'s workers (nullptr: the calling thread only).
struct CpuExec {
  ThreadPool* pool = nullptr;
};

// One CUDA stream and what an op needs beside it. Ops enqueue on `stream` and never
// synchronise; `gemm` is a cuBLASLt handle bound to the same stream (ops that multiply),
// `workspace` that stream's scratch memory (ops that reduce in two passes) and `alloc` where the
// stream's device buffers come from (a model's DeviceVecs through an AllocScope, and
// DevicePtrList::Publish; core/cuda/device_vec.h). Any may be null for ops that do not use it;
// an op that needs a missing one returns FailedPrecondition. `alloc` is last so that
// `CudaExec{stream, gemm, workspace}` still initialises the others.
struct CudaExec {
  CUstream_st* stream = nullptr;  // nullptr: the legacy default stream
  cuda::GemmHandle* gemm = nullptr;
  cuda::Workspace* workspace = nullptr;
  cuda::CachingAllocator* alloc = nullptr;
};

}  // namespace satdar::core

#endif  // SATDAR_CORE_EXEC_H_
