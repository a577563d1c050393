#include "core/cuda/allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#endif

namespace satdar::core::cuda {

namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;  // 2 MiB

class DeviceBackend : public AllocatorBackend {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
#ifdef SATDAR_WITH_CUDA
    void* ptr = nullptr;
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
    return ptr;
#else
    return absl::FailedPreconditionError("satdar was built without CUDA (no nvcc at build time)");
#endif
  }
  void Release(void* ptr) override {
#ifdef SATDAR_WITH_CUDA
    cudaFree(ptr);
#endif
  }
};

}  // namespace

AllocatorBackend* CudaBackend() {
  static DeviceBackend* backend = new DeviceBackend();
  return backend;
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  const size_t unit = bytes < kSmallLimit ? kSmallRound : kLargeRound;
  return (bytes + unit - 1) / unit * unit;
}

CachingAllocator::CachingAllocator(AllocatorBackend* backend) : backend_(backend) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes, CUstream_st* stream) {
  if (bytes == 0) return nullptr;
  const size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = nullptr;
  auto it = free_.find(Key{stream, size});
  if (it != free_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    ++stats_.cache_hits;
  } else {
    absl::StatusOr<void*> got = backend_->Allocate(size);
    if (!got.ok()) {
      // Out of memory (or another failure): give the cache back and try once more.
      EmptyCacheLocked();
      got = backend_->Allocate(size);
      if (!got.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("device allocation of ", size, " bytes failed (in use ",
                         stats_.current_bytes, " bytes): ", got.status().message()));
      }
    }
    ptr = *got;
    ++stats_.device_allocs;
    stats_.reserved_bytes += static_cast<int64_t>(size);
  }
  live_[ptr] = Block{size, stream};
  stats_.current_bytes += static_cast<int64_t>(size);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  return ptr;
}

absl::Status CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return absl::InvalidArgumentError("CachingAllocator::Free: pointer was not allocated here");
  }
  const Block block = it->second;
  live_.erase(it);
  stats_.current_bytes -= static_cast<int64_t>(block.size);
  free_[Key{block.stream, block.size}].push_back(ptr);
  return absl::OkStatus();
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [key, ptrs] : free_) {
    for (void* p : ptrs) {
      backend_->Release(p);
      stats_.reserved_bytes -= static_cast<int64_t>(key.second);
    }
  }
  free_.clear();
}

AllocatorStats CachingAllocator::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
}

}  // namespace satdar::core::cuda
