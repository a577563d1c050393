// core/cuda/sim/runtime_sim.cc: the simulated CUDA runtime of the CUDA simulator build:
// devices, memory, copies, memsets and errors, on the CPU. Streams and events are in
// runtime_sim_streams.cc; what the two share is in runtime_sim_internal.h.
//
// Model (docs/GPU.md has the user-facing summary; runtime_sim_streams.cc describes streams,
// events, sticky errors and process exit):
// - Devices: SATDAR_SIM_DEVICES (0..64, default 8) simulated devices with an H200's limits. The
//   current device is per host thread (default 0); a stream belongs to the device current when
//   it was created, and its worker thread starts with that device current.
// - Memory: every cudaMalloc is one posix_memalign(256) of exactly the requested size, so the
//   sanitizers see a kernel's out-of-bounds access. A registry of live allocations answers
//   IsDeviceRange and the copy/memset checks. cudaMallocHost memory is registered as pinned.
//   cudaFree and cudaFreeHost first wait for the queued work of the device's streams, as
//   CUDA's implicit synchronisation does, so freeing right after async work is not a false
//   use-after-free. Device memory is ordinary host memory: host code that dereferences it
//   is not caught (a PROT_NONE guard arena is not implemented).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/sim/runtime_sim_internal.h"
#include "core/cuda/sim/sim_runtime.h"

namespace satdar::cuda_sim {
namespace {

constexpr size_t kDeviceAlignment = 256;  // cudaMalloc's alignment
constexpr int kDefaultDevices = 8;
constexpr int kMaxDevices = 64;

thread_local cudaError_t t_last_error = cudaSuccess;

const char* ErrorName(cudaError_t error, bool name) {
#define SATDAR_SIM_ERROR(code, text) \
  case code: return name ? #code : text;
  switch (error) {
    SATDAR_SIM_ERROR(cudaSuccess, "no error")
    SATDAR_SIM_ERROR(cudaErrorInvalidValue, "invalid argument")
    SATDAR_SIM_ERROR(cudaErrorMemoryAllocation, "out of memory")
    SATDAR_SIM_ERROR(cudaErrorInitializationError, "initialization error")
    SATDAR_SIM_ERROR(cudaErrorInvalidConfiguration, "invalid configuration argument")
    SATDAR_SIM_ERROR(cudaErrorInvalidDevicePointer, "invalid device pointer")
    SATDAR_SIM_ERROR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")
    SATDAR_SIM_ERROR(cudaErrorInvalidResourceHandle, "invalid resource handle")
    SATDAR_SIM_ERROR(cudaErrorNotReady, "device not ready")
    SATDAR_SIM_ERROR(cudaErrorIllegalAddress, "an illegal memory access was encountered")
    SATDAR_SIM_ERROR(cudaErrorLaunchOutOfResources, "too many resources requested for launch")
    SATDAR_SIM_ERROR(cudaErrorLaunchFailure, "unspecified launch failure")
    SATDAR_SIM_ERROR(cudaErrorNoDevice, "no CUDA-capable device is detected")
    SATDAR_SIM_ERROR(cudaErrorInvalidDevice, "invalid device ordinal")
    SATDAR_SIM_ERROR(cudaErrorUnknown, "unknown error")
  }
#undef SATDAR_SIM_ERROR
  return "unrecognized error code";
}

}  // namespace

thread_local int t_device = 0;

// Never destroyed: stream workers may still run while static destructors run.
Runtime& R() {
  static Runtime* const runtime = [] {
    auto* r = new Runtime;
    std::atexit(AtExit);
    return r;
  }();
  return *runtime;
}

int DeviceCount() {
  static const int count = [] {
    const char* env = std::getenv("SATDAR_SIM_DEVICES");
    if (env == nullptr || *env == '\0') return kDefaultDevices;
    char* end = nullptr;
    const int64_t n = std::strtoll(env, &end, 10);
    if (*end != '\0' || n < 0 || n > kMaxDevices) {
      Report("SATDAR_SIM_DEVICES='" + std::string(env) + "' is not 0.." +
             std::to_string(kMaxDevices) + "; using " + std::to_string(kDefaultDevices));
      return kDefaultDevices;
    }
    return static_cast<int>(n);
  }();
  return count;
}

// Sets the last error (not for NotReady, as CUDA) and returns `err`.
cudaError_t Fail(cudaError_t err) {
  if (err != cudaSuccess && err != cudaErrorNotReady) t_last_error = err;
  return err;
}

namespace {

enum class MemKind { kHost, kPinned, kDevice };

struct Range {
  MemKind kind = MemKind::kHost;
  bool fits = true;  // inside its allocation (unregistered host memory: unknown, true)
};

// The allocation of `m` that contains `p`, or null; its start in *base.
const Allocation* FindBlock(const std::map<uintptr_t, Allocation>& m, uintptr_t p,
                            uintptr_t* base) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  *base = it->first;
  return p - it->first < it->second.bytes ? &it->second : nullptr;
}

Range Classify(const void* ptr, size_t bytes) {
  Range out;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  Runtime& r = R();
  std::lock_guard<std::mutex> lock(r.mem_mu);
  uintptr_t base = 0;
  const Allocation* a = FindBlock(r.device_mem, p, &base);
  out.kind = MemKind::kDevice;
  if (a == nullptr) {
    a = FindBlock(r.pinned_mem, p, &base);
    out.kind = a == nullptr ? MemKind::kHost : MemKind::kPinned;
  }
  if (a != nullptr) out.fits = bytes <= a->bytes - (p - base);
  return out;
}

// cudaMalloc, cudaMallocHost: one heap block of exactly `bytes`, 256-byte aligned.
cudaError_t Allocate(std::map<uintptr_t, Allocation>* registry, void** ptr, size_t bytes) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;  // as CUDA: success, null pointer
  void* p = nullptr;
  if (posix_memalign(&p, kDeviceAlignment, bytes) != 0 || p == nullptr) {
    return Fail(cudaErrorMemoryAllocation);
  }
  std::lock_guard<std::mutex> lock(R().mem_mu);
  (*registry)[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, t_device};
  *ptr = p;
  return cudaSuccess;
}

// cudaFree, cudaFreeHost. As CUDA, the call synchronises with the allocation's device first,
// so queued work that uses the memory finishes before it is freed.
cudaError_t Release(std::map<uintptr_t, Allocation>* registry, void* ptr, cudaError_t bad,
                    const char* what) {
  if (ptr == nullptr) return cudaSuccess;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(R().mem_mu);
    auto it = registry->find(p);
    if (it != registry->end()) device = it->second.device;
  }
  if (device < 0) {
    Report(std::string(what) + " (" + ErrorName(bad, true) + ")");
    return Fail(bad);
  }
  WaitAll(DeviceTails(device, false));
  {
    std::lock_guard<std::mutex> lock(R().mem_mu);
    if (registry->erase(p) == 0) return Fail(bad);  // freed by another thread meanwhile
  }
  std::free(ptr);
  return cudaSuccess;
}

const char* const kKindNames[] = {"HostToHost", "HostToDevice", "DeviceToHost",
                                  "DeviceToDevice", "Default"};

struct CopyPlan {
  bool dst_device = false;
  bool src_device = false;
  bool dst_pageable = false;  // host memory not from cudaMallocHost
  bool src_pageable = false;
};

// Checks a copy's pointers, sizes and direction at call time (nothing is copied on error).
cudaError_t CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      CopyPlan* plan) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    Report("cudaMemcpy with an invalid cudaMemcpyKind (cudaErrorInvalidMemcpyDirection)");
    return cudaErrorInvalidMemcpyDirection;
  }
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  const Range d = Classify(dst, bytes);
  const Range s = Classify(src, bytes);
  const bool d_dev = d.kind == MemKind::kDevice;
  const bool s_dev = s.kind == MemKind::kDevice;
  bool want_d = d_dev;
  bool want_s = s_dev;
  if (kind != cudaMemcpyDefault) {
    want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  }
  if (want_d != d_dev || want_s != s_dev) {
    Report(std::string("cudaMemcpy") + kKindNames[kind] + ": the " +
           (want_d != d_dev ? "destination" : "source") + " is " +
           ((want_d != d_dev ? d_dev : s_dev) ? "device" : "not device") +
           " memory (cudaErrorInvalidMemcpyDirection)");
    return cudaErrorInvalidMemcpyDirection;
  }
  if (!d.fits || !s.fits) {
    Report(std::string("cudaMemcpy") + kKindNames[kind] +
           ": a range runs past the end of its allocation (cudaErrorInvalidValue)");
    return cudaErrorInvalidValue;
  }
  plan->dst_device = d_dev;
  plan->src_device = s_dev;
  plan->dst_pageable = d.kind == MemKind::kHost;
  plan->src_pageable = s.kind == MemKind::kHost;
  return cudaSuccess;
}

// Device memory freed between the call and the run (a bug: cudaFree waits for queued work).
cudaError_t CheckStillLive(bool is_device, const void* ptr, size_t bytes) {
  if (!is_device || IsDeviceRange(ptr, bytes)) return cudaSuccess;
  Report("queued copy or memset touches device memory that was freed before it ran "
         "(cudaErrorIllegalAddress)");
  return cudaErrorIllegalAddress;
}

std::function<cudaError_t()> CopyWork(void* dst, const void* src, size_t bytes,
                                      const CopyPlan& plan) {
  return [=]() {
    cudaError_t err = CheckStillLive(plan.dst_device, dst, bytes);
    if (err == cudaSuccess) err = CheckStillLive(plan.src_device, src, bytes);
    if (err == cudaSuccess) std::memcpy(dst, src, bytes);
    return err;
  };
}

// Queues on the legacy stream and waits: cudaMemcpy, cudaMemset.
cudaError_t RunSyncOnLegacy(std::function<cudaError_t()> work) {
  Position pos;
  cudaError_t err = EnqueueAt(nullptr, std::move(work), {}, &pos);
  if (err == cudaSuccess) err = WaitPosition(pos);
  return Fail(err);
}

cudaError_t CheckMemset(void* ptr, size_t bytes) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  const Range r = Classify(ptr, bytes);
  if (r.kind == MemKind::kDevice && r.fits) return cudaSuccess;
  Report(r.kind != MemKind::kDevice
             ? "cudaMemset of memory that is not device memory (cudaErrorInvalidValue)"
             : "cudaMemset range runs past the end of its allocation (cudaErrorInvalidValue)");
  return cudaErrorInvalidValue;
}

std::function<cudaError_t()> MemsetWork(void* ptr, int value, size_t bytes) {
  return [=]() {
    cudaError_t err = CheckStillLive(true, ptr, bytes);
    if (err == cudaSuccess) std::memset(ptr, value, bytes);
    return err;
  };
}

}  // namespace

cudaError_t Enqueue(cudaStream_t stream, std::function<cudaError_t()> work) {
  if (!work) return cudaErrorInvalidValue;
  return EnqueueAt(stream, std::move(work), {}, nullptr);
}

void SetLastError(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
}

bool IsDeviceRange(const void* ptr, size_t bytes) {
  if (ptr == nullptr) return false;
  const Range r = Classify(ptr, bytes);
  return r.kind == MemKind::kDevice && r.fits;
}

void Report(const std::string& what) {
  Runtime& r = R();
  std::lock_guard<std::mutex> lock(r.report_mu);
  if (!r.reported.insert(what).second) return;
  std::fprintf(stderr, "satdar cuda simulator: %s\n", what.c_str());
}

}  // namespace satdar::cuda_sim

namespace sim = ::satdar::cuda_sim;

cudaError_t cudaGetLastError(void) {
  cudaError_t err = sim::t_last_error;
  sim::t_last_error = cudaSuccess;
  return err;
}

cudaError_t cudaPeekAtLastError(void) { return sim::t_last_error; }

const char* cudaGetErrorString(cudaError_t error) { return sim::ErrorName(error, false); }

const char* cudaGetErrorName(cudaError_t error) { return sim::ErrorName(error, true); }

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return sim::Fail(cudaErrorInvalidValue);
  *count = sim::DeviceCount();
  return *count == 0 ? sim::Fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (sim::DeviceCount() == 0) return sim::Fail(cudaErrorNoDevice);
  if (device < 0 || device >= sim::DeviceCount()) return sim::Fail(cudaErrorInvalidDevice);
  sim::t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return sim::Fail(cudaErrorInvalidValue);
  if (sim::DeviceCount() == 0) return sim::Fail(cudaErrorNoDevice);
  *device = sim::t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return sim::Fail(cudaErrorInvalidValue);
  if (device < 0 || device >= sim::DeviceCount()) return sim::Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "CUDA simulator (H200 limits)");
  prop->totalGlobalMem = size_t{143771} << 20;  // 143771 MiB, as nvidia-smi shows an H200
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = 232448;
  prop->maxThreadsPerBlock = 1024;
  const int threads[3] = {1024, 1024, 64};
  const int grid[3] = {2147483647, 65535, 65535};
  std::memcpy(prop->maxThreadsDim, threads, sizeof(threads));
  std::memcpy(prop->maxGridSize, grid, sizeof(grid));
  prop->warpSize = 32;
  prop->multiProcessorCount = 132;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  return sim::Fail(sim::WaitAll(sim::DeviceTails(sim::t_device, false)));
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (sim::DeviceCount() == 0) return sim::Fail(cudaErrorNoDevice);
  return sim::Allocate(&sim::R().device_mem, ptr, bytes);
}

cudaError_t cudaFree(void* ptr) {
  return sim::Release(&sim::R().device_mem, ptr, cudaErrorInvalidDevicePointer,
                      "cudaFree of a pointer that is not a live cudaMalloc allocation");
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  return sim::Allocate(&sim::R().pinned_mem, ptr, bytes);
}

cudaError_t cudaFreeHost(void* ptr) {
  return sim::Release(&sim::R().pinned_mem, ptr, cudaErrorInvalidValue,
                      "cudaFreeHost of a pointer that is not a live cudaMallocHost allocation");
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  sim::CopyPlan plan;
  cudaError_t err = sim::CheckCopy(dst, src, bytes, kind, &plan);
  if (err != cudaSuccess) return sim::Fail(err);
  if (bytes == 0) return cudaSuccess;
  return sim::RunSyncOnLegacy(sim::CopyWork(dst, src, bytes, plan));
}

// As CUDA: from pageable host memory the source is staged before the call returns (the
// caller may reuse it at once); to pageable host memory the call returns once the copy is done;
// pinned host memory and device-to-device copies are fully asynchronous.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  sim::CopyPlan plan;
  cudaError_t err = sim::CheckCopy(dst, src, bytes, kind, &plan);
  if (err != cudaSuccess) return sim::Fail(err);
  if (bytes == 0) return sim::Fail(sim::EnqueueAt(stream, nullptr, {}, nullptr));
  std::function<cudaError_t()> work;
  if (plan.src_pageable) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    work = [dst, staged, plan]() {
      cudaError_t e = sim::CheckStillLive(plan.dst_device, dst, staged->size());
      if (e == cudaSuccess) std::memcpy(dst, staged->data(), staged->size());
      return e;
    };
  } else {
    work = sim::CopyWork(dst, src, bytes, plan);
  }
  sim::Position pos;
  err = sim::EnqueueAt(stream, std::move(work), {}, &pos);
  if (err == cudaSuccess && plan.dst_pageable) err = sim::WaitPosition(pos);
  return sim::Fail(err);
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  cudaError_t err = sim::CheckMemset(ptr, bytes);
  if (err != cudaSuccess) return sim::Fail(err);
  return sim::RunSyncOnLegacy(sim::MemsetWork(ptr, value, bytes));
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return sim::Fail(sim::EnqueueAt(stream, nullptr, {}, nullptr));
  cudaError_t err = sim::CheckMemset(ptr, bytes);
  if (err != cudaSuccess) return sim::Fail(err);
  return sim::Fail(sim::EnqueueAt(stream, sim::MemsetWork(ptr, value, bytes), {}, nullptr));
}

cudaError_t cudaMemset2DAsync(void* ptr, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream) {
  if (ptr == nullptr || pitch < width) {
    sim::Report("cudaMemset2DAsync with a null pointer or pitch < width (cudaErrorInvalidValue)");
    return sim::Fail(cudaErrorInvalidValue);
  }
  if (width == 0 || height == 0) return sim::Fail(sim::EnqueueAt(stream, nullptr, {}, nullptr));
  if (height - 1 > (SIZE_MAX - width) / (pitch == 0 ? 1 : pitch)) {
    return sim::Fail(cudaErrorInvalidValue);
  }
  const size_t span = pitch * (height - 1) + width;  // first byte to last byte written
  cudaError_t err = sim::CheckMemset(ptr, span);
  if (err != cudaSuccess) return sim::Fail(err);
  auto work = [=]() {
    cudaError_t e = sim::CheckStillLive(true, ptr, span);
    if (e != cudaSuccess) return e;
    for (size_t row = 0; row < height; ++row) {
      std::memset(static_cast<unsigned char*>(ptr) + row * pitch, value, width);
    }
    return cudaSuccess;
  };
  return sim::Fail(sim::EnqueueAt(stream, std::move(work), {}, nullptr));
}
