// core/cuda/allocator.h: a caching device allocator. Freed blocks are not returned to the
// driver but kept on a free list keyed by (stream, size bucket), and handed out again to the
// next request of the same bucket on the same stream, so a training step that allocates the
// same shapes every iteration stops calling cudaMalloc after the first step.
//
// Buckets: requests are rounded up to 512 bytes below 1 MiB and to 2 MiB multiples above; a
// free block is reused only for a request of exactly its bucket (no splitting).
// Stream semantics: a block freed on stream S is reused only by requests on S, whose work is
// ordered after the free; a block used on another stream must be freed after that stream's
// work is complete (the caller synchronises), as nothing here records events.
//
// The device calls go through a Backend, so the bookkeeping is testable without a GPU;
// CudaBackend() is cudaMalloc/cudaFree (an error backend in a build without CUDA).
#ifndef SATDAR_CORE_CUDA_ALLOCATOR_H_
#define SATDAR_CORE_CUDA_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace satdar::core::cuda {

class AllocatorBackend {
 public:
  virtual ~AllocatorBackend() = default;
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Release(void* ptr) = 0;
};

// cudaMalloc / cudaFree on the current device. The returned object is a process-wide singleton.
AllocatorBackend* CudaBackend();

struct AllocatorStats {
  int64_t current_bytes = 0;   // bytes handed out and not yet freed (bucket sizes)
  int64_t peak_bytes = 0;      // maximum of current_bytes since construction or ResetPeak
  int64_t reserved_bytes = 0;  // current_bytes + bytes cached on free lists
  int64_t device_allocs = 0;   // calls that reached the backend
  int64_t cache_hits = 0;      // requests served from a free list
};

class CachingAllocator {
 public:
  explicit CachingAllocator(AllocatorBackend* backend = CudaBackend());
  ~CachingAllocator();  // returns every cached block; blocks still in use are leaked
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 gives nullptr) usable on `stream` (nullptr: the default).
  // On a backend failure the cache is emptied and the request retried once.
  absl::StatusOr<void*> Allocate(size_t bytes, CUstream_st* stream = nullptr);
  // Returns a block to its stream's free list; nullptr is ignored; an unknown pointer is an error.
  absl::Status Free(void* ptr);
  // Gives every cached (free) block back to the backend.
  void EmptyCache();
  AllocatorStats Stats() const;
  void ResetPeak();

  static size_t RoundSize(size_t bytes);

 private:
  struct Block {
    size_t size;
    CUstream_st* stream;
  };
  using Key = std::pair<CUstream_st*, size_t>;
  void EmptyCacheLocked();

  AllocatorBackend* backend_;
  mutable std::mutex mu_;
  std::map<Key, std::vector<void*>> free_;
  std::unordered_map<void*, Block> live_;
  AllocatorStats stats_;
};

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_CUDA_ALLOCATOR_H_
