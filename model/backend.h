// model/backend.h: the device a model's classes are compiled for (docs/ONE_MODEL_PLAN.md, S5).
// Every design class is a template on a backend B, one of
//   Cpu<float>, Cpu<double>     the reference (f64 for gradient checks)
//   Cuda<float>, Cuda<__nv_bfloat16>  CUDA builds only (the classes are instantiated on them
//                               in S6)
// and reads from it:
//   B::T        the activations' element type and the weights the ops multiply by
//   B::Acc      master weights, scalars and parameter gradients (T on the CPU, fp32 on CUDA)
//   B::Exec     the execution context the ops take first (core/exec.h)
//   B::Vec<U>   an owned buffer of U on the device: resize(n) (zeros), assign(n, v), data(),
//               size(), empty(); on the CPU std::vector
//   B::PtrList<P>  a list of buffer pointers that an op reads as one array (HostPtrList below)
//   B::AllocScope  opened from the Exec by a model's entry points (Forward, Backward, Resize):
//               where Vec's resize/assign allocate on CUDA, and the first failure among them
//               (status()); on the CPU a no-op that is always OK
//   B::kDevice  whether Vec's contents live on a device (never read on the host)
// A class's arithmetic is ops (core/ops/ops.h, core/ops/elementwise.h, <design>_ops.h) on
// pointers into Vec buffers; its host state (offsets, statistics, counts) stays std::vector.
#ifndef SATDAR_MODEL_BACKEND_H_
#define SATDAR_MODEL_BACKEND_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "core/exec.h"

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
#include "core/cuda/device_vec.h"
#endif

namespace satdar::model {

// A list of pointers (P is `const T*` or `T*`) written on the host and read by an op as an
// array: write entries, then Publish() before an op reads data(); the list stays valid until
// the next write. On the CPU data() is the host array and Publish does nothing; on CUDA the
// list keeps a device copy that Publish uploads on the stream.
template <typename P>
class HostPtrList {
 public:
  void assign(size_t n, P value) { host_.assign(n, value); }
  void clear() { host_.clear(); }
  void push_back(P p) { host_.push_back(p); }
  size_t size() const { return host_.size(); }
  P& operator[](size_t i) { return host_[i]; }
  const P& operator[](size_t i) const { return host_[i]; }
  absl::Status Publish(const core::CpuExec& x) {
    (void)x;
    return absl::OkStatus();
  }
  // What an op reads (after Publish).
  const P* data() const { return host_.data(); }
  P* data() { return host_.data(); }

 private:
  std::vector<P> host_;
};

// CPU: no device memory to scope; status() is always OK (std::vector's allocation failures
// are not Statuses).
struct HostAllocScope {
  explicit HostAllocScope(const core::CpuExec&) {}
  absl::Status status() const { return absl::OkStatus(); }
};

template <typename E>
struct Cpu {
  using T = E;
  using Acc = E;
  using Exec = core::CpuExec;
  template <typename U>
  using Vec = std::vector<U>;
  template <typename P>
  using PtrList = HostPtrList<P>;
  using AllocScope = HostAllocScope;
  static constexpr bool kDevice = false;
};

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)
// CUDA (E float or __nv_bfloat16): activations in E, master weights, scalars and gradients in
// fp32; buffers are core/cuda/device_vec.h's, allocated through the AllocScope's
// CudaExec::alloc on its stream.
template <typename E>
struct Cuda {
  using T = E;
  using Acc = float;
  using Exec = core::CudaExec;
  template <typename U>
  using Vec = core::cuda::DeviceVec<U>;
  template <typename P>
  using PtrList = core::cuda::DevicePtrList<P>;
  using AllocScope = core::cuda::AllocScope;
  static constexpr bool kDevice = true;
};
#endif  // SATDAR_WITH_CUDA || __CUDACC__

// Runs `size` (resizes of B's buffers) in a scope of its own and returns its first allocation
// failure: for the buffers a pass sizes as it goes (a failed device allocation leaves a buffer
// short, so the pass must stop before an op writes it). Always OK on the CPU.
//   SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] { ye.resize(n * d); }));
template <class B, class F>
absl::Status Allocate(const typename B::Exec& x, F&& size) {
  typename B::AllocScope scope(x);
  size();
  return scope.status();
}

// The weights of one pass: `compute` is what the ops multiply activations by (B::T), `master`
// the same parameters in B::Acc, what scalars (mixing logits, gates, norms of coefficients)
// are read from. On the CPU both are the one parameter buffer; on CUDA the bf16 compute copy
// and the fp32 master weights (the same buffer in f32). Offsets are the param table's.
template <class B>
struct Weights {
  const typename B::T* compute = nullptr;
  const typename B::Acc* master = nullptr;
};

}  // namespace satdar::model

#endif  // SATDAR_MODEL_BACKEND_H_
