// core/cuda/device_vec.h: the owned device buffers of a model on CUDA (docs/ONE_MODEL_PLAN.md,
// S6): DeviceVec<U>, std::vector's sizing semantics on device memory (model/backend.h's
// Cuda<E>::Vec), and DevicePtrList<P>, a host-written list of pointers that kernels read as a
// device array (Cuda<E>::PtrList).
//
// A model's code resizes its activation buffers with the same calls on both devices
// (`buf.resize(n)`), so the allocator and the stream cannot be arguments: they come from the
// innermost AllocScope of the calling thread, which the model's entry points open from their
// CudaExec:
//
//   core::cuda::AllocScope scope(x);   // x.alloc and x.stream
//   out_.resize(n);                     // stream-ordered on x.stream
//   SATDAR_RETURN_IF_ERROR(scope.status());
//
// A failure (allocation, copy, memset, fill) leaves that vector empty and is kept by the scope,
// so a pass can resize many buffers and check once. Every vector of a model lives on one
// stream: a block is freed to the stream it was allocated on, and the allocator's reuse is safe
// only in that stream's order (core/cuda/allocator.h).
#ifndef SATDAR_CORE_CUDA_DEVICE_VEC_H_
#define SATDAR_CORE_CUDA_DEVICE_VEC_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/cuda/allocator.h"
#include "core/exec.h"

namespace satdar::core::cuda {

// Where DeviceVec::resize/assign/copy allocate, for the scope's lifetime on this thread: the
// allocator and stream of x (x.alloc must be set; a null one is a programming error and
// CHECK-fails). Scopes nest (the innermost wins). The first failure (allocation, copy, memset)
// of any DeviceVec operation inside the scope is kept; the operation leaves that vector empty.
// DevicePtrList::Publish takes its CudaExec directly and needs no scope.
class AllocScope {
 public:
  explicit AllocScope(const CudaExec& x);
  ~AllocScope();  // restores the enclosing scope
  AllocScope(const AllocScope&) = delete;
  AllocScope& operator=(const AllocScope&) = delete;

  // The first failure inside this scope, or OK.
  absl::Status status() const { return status_; }

  // For DeviceVec's implementation: the innermost scope of this thread (nullptr: none).
  static AllocScope* Current();
  CachingAllocator* alloc() const { return alloc_; }
  CUstream_st* stream() const { return stream_; }
  // Keeps `s` when it is the first failure; returns s.ok().
  bool Record(absl::Status s);

 private:
  CachingAllocator* alloc_;
  CUstream_st* stream_;
  AllocScope* enclosing_;
  absl::Status status_;
};

namespace internal {

// A device block and the allocator it goes back to (type-erased storage of DeviceVec and
// DevicePtrList, so the stream-ordered work lives in device_vec.cu once for every U).
struct DeviceBlock {
  void* ptr = nullptr;
  CachingAllocator* alloc = nullptr;
};

// Frees b->ptr to b->alloc (on the stream it was allocated on) and empties *b. A pointer the
// allocator does not know is a programming error (double free) and CHECK-fails.
void FreeBlock(DeviceBlock* b);
// The innermost AllocScope; CHECK-fails naming `op` when this thread has none.
AllocScope& ScopeFor(const char* op);
// *b (old_bytes long) becomes new_bytes (> 0) long: the first min(old_bytes, new_bytes) bytes
// are the old ones, the rest zero. On failure *b is empty, the failure is recorded in `scope`
// and false is returned.
bool ResizeBlock(AllocScope& scope, DeviceBlock* b, size_t old_bytes, size_t new_bytes);
// *b (old_bytes long) becomes n (> 0) elements of elem_size (1, 2, 4 or 8) bytes, each equal to
// the bytes at `value` (memset when they are all zero, a fill kernel otherwise). The block is
// reused when the size is unchanged. Failure as in ResizeBlock.
bool FillBlock(AllocScope& scope, DeviceBlock* b, size_t old_bytes, size_t n, size_t elem_size,
               const void* value);
// *dst becomes a copy of the first `bytes` (> 0) of src (device to device). Failure as in
// ResizeBlock.
bool CopyBlock(AllocScope& scope, DeviceBlock* dst, const DeviceBlock& src, size_t bytes);
// Uploads `bytes` of host memory into *b (capacity in *capacity_bytes, grown through x.alloc on
// x.stream when too small) with cudaMemcpyAsync on x.stream. FailedPrecondition when x has no
// allocator; on a failed allocation *b is empty.
absl::Status UploadBlock(const CudaExec& x, DeviceBlock* b, size_t* capacity_bytes,
                         const void* host, size_t bytes);

}  // namespace internal

// An owned device buffer of U with std::vector's sizing semantics, for model activations:
//   resize(n): keeps min(n, size) old elements, new elements zero (stream-ordered copy +
//              memset on the scope's stream; the old block freed to its allocator)
//   assign(n, value): n elements equal to value (fill kernel; memset when value is all zero
//              bits)
//   data(), size(), empty(), swap(other), clear() (frees)
// resize/assign to a non-zero size and copies of a non-empty vector need an AllocScope on this
// thread (even when the size does not change, so a missing scope shows on the first call);
// without one they CHECK-fail naming the call. resize(0), assign(0, v), clear() and copying an
// empty vector need none. Copy construction/assignment deep-copies (std::vector<DeviceVec>'s
// assign(n, DeviceVec()) needs it); move is noexcept and cheap. Destruction frees to the
// allocator the block came from (no scope needed). The contents are device memory: data() is
// for kernels and cudaMemcpy, never for host reads.
// U: any trivially copyable type of 1, 2, 4 or 8 bytes (float, __nv_bfloat16, double, int,
// int64_t, pointers).
template <typename U>
class DeviceVec {
  static_assert(std::is_trivially_copyable_v<U>, "DeviceVec holds trivially copyable types");
  static_assert(sizeof(U) == 1 || sizeof(U) == 2 || sizeof(U) == 4 || sizeof(U) == 8,
                "DeviceVec's fill kernel handles elements of 1, 2, 4 or 8 bytes");

 public:
  using value_type = U;

  DeviceVec() = default;
  ~DeviceVec() { internal::FreeBlock(&block_); }
  DeviceVec(const DeviceVec& other) { CopyFrom(other); }
  DeviceVec& operator=(const DeviceVec& other) {
    if (this != &other) CopyFrom(other);
    return *this;
  }
  DeviceVec(DeviceVec&& other) noexcept
      : block_(std::exchange(other.block_, internal::DeviceBlock{})),
        size_(std::exchange(other.size_, 0)) {}
  DeviceVec& operator=(DeviceVec&& other) noexcept {
    DeviceVec moved(std::move(other));
    swap(moved);
    return *this;  // the old block goes with `moved`
  }

  void resize(size_t n) {
    if (n == 0) {
      clear();
      return;
    }
    AllocScope& scope = internal::ScopeFor("DeviceVec::resize");
    if (n == size_) return;
    size_ = internal::ResizeBlock(scope, &block_, size_ * sizeof(U), n * sizeof(U)) ? n : 0;
  }

  void assign(size_t n, const U& value) {
    if (n == 0) {
      clear();
      return;
    }
    AllocScope& scope = internal::ScopeFor("DeviceVec::assign");
    size_ = internal::FillBlock(scope, &block_, size_ * sizeof(U), n, sizeof(U), &value) ? n : 0;
  }

  void clear() {
    internal::FreeBlock(&block_);
    size_ = 0;
  }
  void swap(DeviceVec& other) noexcept {
    std::swap(block_, other.block_);
    std::swap(size_, other.size_);
  }

  U* data() { return static_cast<U*>(block_.ptr); }
  const U* data() const { return static_cast<const U*>(block_.ptr); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void CopyFrom(const DeviceVec& other) {
    if (other.size_ == 0) {
      clear();
      return;
    }
    AllocScope& scope = internal::ScopeFor("DeviceVec copy");
    size_ = internal::CopyBlock(scope, &block_, other.block_, other.size_ * sizeof(U))
                ? other.size_
                : 0;
  }

  internal::DeviceBlock block_;
  size_t size_ = 0;
};

template <typename U>
void swap(DeviceVec<U>& a, DeviceVec<U>& b) noexcept {
  a.swap(b);
}

// A list of pointers (P is `const T*` or `T*`) written on the host and read by kernels as a
// device array: the interface of model/backend.h's HostPtrList. Write entries, then
// Publish(x) before a kernel reads data(): it uploads the host entries to the device copy
// (grown through x.alloc on x.stream) with cudaMemcpyAsync from the host array, which is
// pageable, so the host entries may change as soon as Publish returns; kernels enqueued on
// x.stream after it read what was published. data() is the device copy (nullptr before the
// first Publish of a non-empty list). Copying copies the host entries only (publish the copy
// before use); moving moves both.
template <typename P>
class DevicePtrList {
  static_assert(std::is_pointer_v<P>, "DevicePtrList holds pointers");

 public:
  DevicePtrList() = default;
  ~DevicePtrList() { internal::FreeBlock(&device_); }
  DevicePtrList(const DevicePtrList& other) : host_(other.host_) {}
  DevicePtrList& operator=(const DevicePtrList& other) {
    host_ = other.host_;
    return *this;
  }
  DevicePtrList(DevicePtrList&& other) noexcept
      : host_(std::move(other.host_)),
        device_(std::exchange(other.device_, internal::DeviceBlock{})),
        capacity_bytes_(std::exchange(other.capacity_bytes_, 0)) {}
  DevicePtrList& operator=(DevicePtrList&& other) noexcept {
    DevicePtrList moved(std::move(other));
    std::swap(host_, moved.host_);
    std::swap(device_, moved.device_);
    std::swap(capacity_bytes_, moved.capacity_bytes_);
    return *this;
  }

  void assign(size_t n, P value) { host_.assign(n, value); }
  void clear() { host_.clear(); }
  void push_back(P p) { host_.push_back(p); }
  size_t size() const { return host_.size(); }
  P& operator[](size_t i) { return host_[i]; }
  const P& operator[](size_t i) const { return host_[i]; }

  absl::Status Publish(const CudaExec& x) {
    return internal::UploadBlock(x, &device_, &capacity_bytes_, host_.data(),
                                 host_.size() * sizeof(P));
  }
  // What a kernel reads (after Publish).
  const P* data() const { return static_cast<const P*>(device_.ptr); }
  P* data() { return static_cast<P*>(device_.ptr); }

 private:
  std::vector<P> host_;
  internal::DeviceBlock device_;
  size_t capacity_bytes_ = 0;
};

}  // namespace satdar::core::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_CORE_CUDA_DEVICE_VEC_H_
