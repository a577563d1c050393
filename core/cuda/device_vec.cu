// core/cuda/device_vec.cu: the type-erased, stream-ordered work behind core/cuda/device_vec.h
// (allocations through the AllocScope's CachingAllocator, copies and memsets on its stream,
// the fill kernel of DeviceVec::assign) and the thread's stack of AllocScopes.
#include "core/cuda/device_vec.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"

namespace satdar::core::cuda {

namespace {

using ::satdar::core::cuda::device::GridBlocks;

constexpr int kThreads = 256;

// The innermost AllocScope of this thread (nullptr: none).
thread_local AllocScope* current_scope = nullptr;

// dst[i] = value for i < n; W is an unsigned integer of the element's size, so one kernel per
// size serves every element type (only the bits are copied).
template <typename W>
__global__ void FillKernel(W* dst, W value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

template <typename W>
absl::Status LaunchFill(void* dst, const void* value, int64_t n, CUstream_st* stream) {
  W bits;
  std::memcpy(&bits, value, sizeof(W));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("FillKernel", FillKernel<W>, dim3(GridBlocks(n, kThreads)),
                                     dim3(kThreads), 0, stream, static_cast<W*>(dst), bits, n));
  return absl::OkStatus();
}

// n elements of elem_size bytes at dst, each the bytes at `value`, enqueued on `stream`.
absl::Status Fill(void* dst, size_t n, size_t elem_size, const void* value, CUstream_st* stream) {
  const unsigned char* bytes = static_cast<const unsigned char*>(value);
  if (std::all_of(bytes, bytes + elem_size, [](unsigned char b) { return b == 0; })) {
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, n * elem_size, stream));
    return absl::OkStatus();
  }
  const int64_t count = static_cast<int64_t>(n);
  switch (elem_size) {
    case 1:
      return LaunchFill<uint8_t>(dst, value, count, stream);
    case 2:
      return LaunchFill<uint16_t>(dst, value, count, stream);
    case 4:
      return LaunchFill<uint32_t>(dst, value, count, stream);
    case 8:
      return LaunchFill<uint64_t>(dst, value, count, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceVec::assign: no fill for elements of ", elem_size, " bytes"));
  }
}

// dst (new_bytes) = the first `keep` bytes of src, then zeros; on `stream`.
absl::Status CopyThenZero(void* dst, const void* src, size_t keep, size_t new_bytes,
                          CUstream_st* stream) {
  if (keep > 0) {
    SATDAR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, keep, cudaMemcpyDeviceToDevice, stream));
  }
  if (new_bytes > keep) {
    SATDAR_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(static_cast<char*>(dst) + keep, 0, new_bytes - keep, stream));
  }
  return absl::OkStatus();
}

// `s` with `op` in front of its message, so a scope's status names the call that failed.
absl::Status Named(const char* op, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(op, ": ", s.message()));
}

// A new block of `bytes` for *b from the scope's allocator (b must be empty). On failure the
// error is recorded and false returned.
bool AllocateInto(AllocScope& scope, internal::DeviceBlock* b, size_t bytes, const char* op) {
  absl::StatusOr<void*> p = scope.alloc()->Allocate(bytes, scope.stream());
  if (!p.ok()) return scope.Record(Named(op, p.status()));
  b->ptr = *p;
  b->alloc = scope.alloc();
  return true;
}

}  // namespace

AllocScope::AllocScope(const CudaExec& x)
    : alloc_(x.alloc), stream_(x.stream), enclosing_(current_scope) {
  SATDAR_CHECK(alloc_ != nullptr) << "AllocScope: the CudaExec has no allocator (alloc)";
  current_scope = this;
}

AllocScope::~AllocScope() { current_scope = enclosing_; }

AllocScope* AllocScope::Current() { return current_scope; }

bool AllocScope::Record(absl::Status s) {
  const bool ok = s.ok();
  status_.Update(std::move(s));  // keeps the first failure
  return ok;
}

namespace internal {

void FreeBlock(DeviceBlock* b) {
  if (b->ptr == nullptr) return;
  const absl::Status s = b->alloc->Free(b->ptr);
  SATDAR_CHECK(s.ok()) << "DeviceVec: freeing a device block: " << s;
  *b = DeviceBlock{};
}

AllocScope& ScopeFor(const char* op) {
  AllocScope* scope = AllocScope::Current();
  SATDAR_CHECK(scope != nullptr) << op
                                 << " needs a core::cuda::AllocScope on this thread (open one "
                                    "from the CudaExec at the entry point)";
  return *scope;
}

bool ResizeBlock(AllocScope& scope, DeviceBlock* b, size_t old_bytes, size_t new_bytes) {
  constexpr const char* kOp = "DeviceVec::resize";
  DeviceBlock fresh;
  if (!AllocateInto(scope, &fresh, new_bytes, kOp)) {
    FreeBlock(b);
    return false;
  }
  const absl::Status s = CopyThenZero(fresh.ptr, b->ptr, std::min(old_bytes, new_bytes),
                                      new_bytes, scope.stream());
  // Stream order makes freeing the old block safe once the copy is enqueued: the allocator
  // hands it out again only to later work on the same stream.
  FreeBlock(b);
  if (!s.ok()) {
    FreeBlock(&fresh);
    return scope.Record(Named(kOp, s));
  }
  *b = fresh;
  return true;
}

bool FillBlock(AllocScope& scope, DeviceBlock* b, size_t old_bytes, size_t n, size_t elem_size,
               const void* value) {
  constexpr const char* kOp = "DeviceVec::assign";
  const size_t bytes = n * elem_size;
  if (b->ptr == nullptr || old_bytes != bytes) {
    // The old contents are not kept: free first, so the allocator may hand the same block back.
    FreeBlock(b);
    if (!AllocateInto(scope, b, bytes, kOp)) return false;
  }
  const absl::Status s = Fill(b->ptr, n, elem_size, value, scope.stream());
  if (!s.ok()) {
    FreeBlock(b);
    return scope.Record(Named(kOp, s));
  }
  return true;
}

bool CopyBlock(AllocScope& scope, DeviceBlock* dst, const DeviceBlock& src, size_t bytes) {
  constexpr const char* kOp = "DeviceVec copy";
  DeviceBlock fresh;
  if (!AllocateInto(scope, &fresh, bytes, kOp)) {
    FreeBlock(dst);
    return false;
  }
  const absl::Status s = CopyThenZero(fresh.ptr, src.ptr, bytes, bytes, scope.stream());
  FreeBlock(dst);
  if (!s.ok()) {
    FreeBlock(&fresh);
    return scope.Record(Named(kOp, s));
  }
  *dst = fresh;
  return true;
}

absl::Status UploadBlock(const CudaExec& x, DeviceBlock* b, size_t* capacity_bytes,
                         const void* host, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (x.alloc == nullptr) {
    return absl::FailedPreconditionError(
        "DevicePtrList::Publish: the CudaExec has no allocator (alloc)");
  }
  if (b->ptr == nullptr || *capacity_bytes < bytes) {
    FreeBlock(b);
    *capacity_bytes = 0;
    absl::StatusOr<void*> p = x.alloc->Allocate(bytes, x.stream);
    if (!p.ok()) return Named("DevicePtrList::Publish", p.status());
    b->ptr = *p;
    b->alloc = x.alloc;
    *capacity_bytes = bytes;
  }
  // From pageable memory: the runtime stages the bytes before returning, so the caller may
  // rewrite its entries at once; kernels enqueued later on x.stream see this copy.
  SATDAR_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(b->ptr, host, bytes, cudaMemcpyHostToDevice, x.stream));
  return absl::OkStatus();
}

}  // namespace internal

}  // namespace satdar::core::cuda
