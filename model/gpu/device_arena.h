// model/gpu/device_arena.h: the (B, T)-sized device buffers of one GPU model part, taken from
// the caching allocator and given back together when the batch shape changes or the part is
// destroyed. CUDA builds only.
#ifndef SATDAR_MODEL_GPU_DEVICE_ARENA_H_
#define SATDAR_MODEL_GPU_DEVICE_ARENA_H_

#ifdef SATDAR_WITH_CUDA

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/check.h"
#include "core/cuda/allocator.h"

namespace satdar::model::gpu {

class DeviceArena {
 public:
  DeviceArena(core::cuda::CachingAllocator* alloc, CUstream_st* stream)
      : alloc_(alloc), stream_(stream) {}
  ~DeviceArena() { FreeAll(); }  // the owner synchronises its stream first
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // *p = count elements of U.
  template <typename U>
  absl::Status Alloc(U** p, size_t count) {
    SATDAR_ASSIGN_OR_RETURN(void* raw, alloc_->Allocate(count * sizeof(U), stream_));
    blocks_.push_back(raw);
    bytes_ += static_cast<int64_t>(count * sizeof(U));
    *p = static_cast<U*>(raw);
    return absl::OkStatus();
  }
  void FreeAll() {
    for (void* p : blocks_) (void)alloc_->Free(p);
    blocks_.clear();
    bytes_ = 0;
  }
  int64_t bytes() const { return bytes_; }

 private:
  core::cuda::CachingAllocator* alloc_;
  CUstream_st* stream_;
  std::vector<void*> blocks_;
  int64_t bytes_ = 0;
};

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_GPU_DEVICE_ARENA_H_
