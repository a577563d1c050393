#include "core/cuda/workspace.h"

namespace satdar::core::cuda {

Workspace::~Workspace() {
  if (block_ != nullptr) alloc_->Free(block_).IgnoreError();  // a pointer it handed out
}

absl::StatusOr<void*> Workspace::Bytes(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes <= capacity_) return block_;
  // The old block goes back to the allocator's free list for this stream; if the new request
  // then fails and the allocator empties its cache, cudaFree synchronises first, so kernels
  // still reading the old block finish before it is released.
  if (block_ != nullptr) {
    absl::Status freed = alloc_->Free(block_);
    block_ = nullptr;
    capacity_ = 0;
    if (!freed.ok()) return freed;
  }
  absl::StatusOr<void*> p = alloc_->Allocate(bytes, stream_);
  if (!p.ok()) return p.status();
  block_ = *p;
  capacity_ = CachingAllocator::RoundSize(bytes);
  return block_;
}

}  // namespace satdar::core::cuda
