// core/cuda/workspace.h: scratch device memory for the ops of one stream (CudaExec::workspace).
// An op asks for what it needs when it starts (Get), uses it in the kernels it enqueues and
// gives nothing back: the next op on the same stream may get the same bytes, which is safe
// because the stream runs the two ops' kernels in order. The block grows to the largest request
// (the old one goes back to the CachingAllocator on the same stream, where the same ordering
// makes reuse safe) and is returned when the Workspace goes. Contents are undefined at each
// Get. Bound to one stream (a stream may have several, e.g. the model's and the engine's);
// not thread-safe.
#ifndef SATDAR_CORE_CUDA_WORKSPACE_H_
#define SATDAR_CORE_CUDA_WORKSPACE_H_

#include <cstddef>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/allocator.h"
#include "core/exec.h"

namespace satdar::core::cuda {

class Workspace {
 public:
  Workspace(CachingAllocator* alloc, CUstream_st* stream) : alloc_(alloc), stream_(stream) {}
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // At least `bytes` of device memory on this workspace's stream (0 bytes: nullptr).
  absl::StatusOr<void*> Bytes(size_t bytes);
  // `count` elements of T (the block is allocator-aligned, 256 bytes or more).
  template <typename T>
  absl::StatusOr<T*> Get(size_t count) {
    absl::StatusOr<void*> p = Bytes(count * sizeof(T));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }

  size_t capacity() const { return capacity_; }
  CUstream_st* stream() const { return stream_; }

 private:
  CachingAllocator* alloc_;
  CUstream_st* stream_;
  void* block_ = nullptr;
  size_t capacity_ = 0;
};

// An op's scratch: `count` elements of T from x.workspace, valid until the next Get on it;
// FailedPrecondition naming `op` when x has no workspace. A launcher that needs two regions
// carves them from one call: a second one may grow the block and invalidate the first.
template <typename T>
absl::StatusOr<T*> Scratch(const CudaExec& x, size_t count, const char* op) {
  if (x.workspace == nullptr) {
    return absl::FailedPreconditionError(std::string(op) +
                                         ": the CudaExec has no workspace for its scratch");
  }
  return x.workspace->Get<T>(count);
}

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_CUDA_WORKSPACE_H_
