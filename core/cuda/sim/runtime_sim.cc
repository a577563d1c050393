// core/cuda/sim/runtime_sim.cc: the simulated CUDA runtime of the CUDA simulator build:
// devices, memory, copies, memsets, streams, events and errors, on the CPU.
//
// Model (docs/GPU.md has the user-facing summary):
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
// - Streams: one worker thread and FIFO per stream. A work item has dependencies (queue
//   positions of other streams) that the worker waits for before running it. A position is
//   (stream, n): reached when the stream has finished its first n items.
//   Legacy default stream (0, cudaStreamLegacy): one per device, with its own worker; an item
//   on it depends on the tails of all blocking streams of its device, and an item on a
//   blocking stream depends on the legacy stream's tail. cudaStreamPerThread is not supported
//   (satdar does not use it): cudaErrorInvalidResourceHandle and a report.
// - Events: cudaEventRecord queues a marker item and stores its position; cudaStreamWaitEvent
//   queues a marker that depends on the position copied at call time.
// - Errors: a queued item that returns an error makes it its stream's sticky error: the stream
//   skips all later items (as a faulted context runs nothing more), and every later
//   synchronising call on the stream (cudaStreamSynchronize/Query, cudaEventSynchronize/Query
//   of a later position, cudaDeviceSynchronize) returns it and sets it as the calling thread's
//   last error, until the stream is destroyed. Waiting on a failed position (an event, or the
//   legacy stream's implicit dependencies) fails the waiting stream with the same error, so a
//   fault spreads along the dependencies the way it takes down a whole context in CUDA, while
//   streams with no dependency on it keep working (unlike CUDA, where the context is lost).
// - Process exit: an atexit handler stops the workers: queued items that have not started are
//   dropped (as CUDA tears down a context), a running item is given 2 s to finish. Runtime state
//   is never destroyed, so workers never see destroyed statics of this file.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda/sim/sim_runtime.h"

namespace satdar::cuda_sim {
namespace {

constexpr size_t kDeviceAlignment = 256;  // cudaMalloc's alignment
constexpr int kDefaultDevices = 8;
constexpr int kMaxDevices = 64;

struct SimStream;

// A queue position: reached when `stream` has finished its first `seq` items.
struct Position {
  std::shared_ptr<SimStream> stream;
  uint64_t seq = 0;  // 0: nothing to wait for
};

struct Item {
  std::function<cudaError_t()> work;  // empty for markers (event record, event wait)
  std::vector<Position> deps;
  uint64_t seq = 0;
};

struct SimStream {
  SimStream(int dev, bool is_legacy, bool is_blocking)
      : device(dev), legacy(is_legacy), blocking(is_blocking) {}
  const int device;
  const bool legacy;    // the legacy default stream of `device`
  const bool blocking;  // created without cudaStreamNonBlocking (legacy: false)
  std::mutex mu;
  std::condition_variable cv;  // queue changes, progress, stop
  std::deque<Item> queue;      // guarded by mu, as are the fields below
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  bool stop = false;
  bool exited = false;   // the worker has left its loop
  bool claimed = false;  // cudaStreamDestroy or AtExit has taken the job of ending the worker
  cudaError_t error = cudaSuccess;  // sticky
  uint64_t error_seq = 0;           // the item that failed
  std::thread thread;
};

struct SimEvent {
  std::mutex mu;
  Position pos;  // guarded by mu; no stream: never recorded (complete)
};

struct Allocation {
  size_t bytes;
  int device;
};

struct Runtime {
  // Guards streams, legacy and events, and is held while an item is queued, so "earlier work"
  // of the legacy-stream rules follows the order of the host calls.
  std::mutex mu;
  std::unordered_map<const void*, std::shared_ptr<SimStream>> streams;
  std::vector<std::shared_ptr<SimStream>> legacy;  // per device, created on first use
  std::unordered_map<const void*, std::shared_ptr<SimEvent>> events;
  std::vector<std::shared_ptr<SimStream>> orphans;  // kept alive for detached workers

  std::mutex mem_mu;  // guards the two maps below
  std::map<uintptr_t, Allocation> device_mem;
  std::map<uintptr_t, Allocation> pinned_mem;

  std::mutex report_mu;
  std::set<std::string> reported;
};

std::atomic<bool> g_exiting{false};
thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

void AtExit();

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

// Sets the last error (not for NotReady, as CUDA) and returns `err`.
cudaError_t Fail(cudaError_t err) {
  if (err != cudaSuccess && err != cudaErrorNotReady) t_last_error = err;
  return err;
}

cudaError_t PositionErrorLocked(const SimStream& s, uint64_t seq) {
  return s.error != cudaSuccess && s.error_seq <= seq ? s.error : cudaSuccess;
}

// Blocks until `p` is reached (or the process exits); its stream's error if it failed by then.
cudaError_t WaitPosition(const Position& p) {
  if (p.stream == nullptr || p.seq == 0) return cudaSuccess;
  SimStream& s = *p.stream;
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return s.completed >= p.seq || g_exiting.load(); });
  return PositionErrorLocked(s, p.seq);
}

// NotReady, the position's error, or success.
cudaError_t QueryPosition(const Position& p) {
  if (p.stream == nullptr || p.seq == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(p.stream->mu);
  if (p.stream->completed < p.seq) return cudaErrorNotReady;
  return PositionErrorLocked(*p.stream, p.seq);
}

cudaError_t WaitAll(const std::vector<Position>& positions) {
  cudaError_t result = cudaSuccess;
  for (const Position& p : positions) {
    cudaError_t err = WaitPosition(p);
    if (result == cudaSuccess) result = err;
  }
  return result;
}

Position Tail(const std::shared_ptr<SimStream>& s) {
  std::lock_guard<std::mutex> lock(s->mu);
  return Position{s, s->enqueued};
}

// Waits for the item's dependencies, then runs it unless the stream has already failed.
cudaError_t RunItem(SimStream& s, Item& item) {
  cudaError_t dep_error = WaitAll(item.deps);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.error != cudaSuccess) return cudaSuccess;  // skipped; the sticky error stays
  }
  if (dep_error != cudaSuccess || g_exiting.load()) return dep_error;
  return item.work ? item.work() : cudaSuccess;
}

void RunStream(SimStream* s) {
  t_device = s->device;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [s] { return !s->queue.empty() || s->stop || g_exiting.load(); });
      if (g_exiting.load() || s->queue.empty()) {
        s->exited = true;
        s->cv.notify_all();
        return;
      }
      item = std::move(s->queue.front());
      s->queue.pop_front();
    }
    cudaError_t err = RunItem(*s, item);
    item.work = nullptr;  // release what the work captured before the item counts as done
    item.deps.clear();
    std::lock_guard<std::mutex> lock(s->mu);
    if (err != cudaSuccess && s->error == cudaSuccess) {
      s->error = err;
      s->error_seq = item.seq;
    }
    s->completed = item.seq;
    s->cv.notify_all();
  }
}

std::shared_ptr<SimStream> NewStream(int device, bool legacy, bool blocking) {
  auto s = std::make_shared<SimStream>(device, legacy, blocking);
  s->thread = std::thread(RunStream, s.get());
  return s;
}

// Requires R().mu.
std::shared_ptr<SimStream> LegacyLocked(int device) {
  Runtime& r = R();
  if (r.legacy.empty()) r.legacy.resize(DeviceCount());
  if (r.legacy[device] == nullptr) r.legacy[device] = NewStream(device, true, false);
  return r.legacy[device];
}

bool IsLegacyHandle(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy;
}

// Requires R().mu. The stream behind a handle, or an error.
cudaError_t ResolveLocked(cudaStream_t stream, std::shared_ptr<SimStream>* out) {
  if (IsLegacyHandle(stream)) {
    if (t_device < 0 || t_device >= DeviceCount()) return cudaErrorNoDevice;
    *out = LegacyLocked(t_device);
    return cudaSuccess;
  }
  if (stream == cudaStreamPerThread) {
    // Not simulated: satdar uses created streams and the legacy default stream only.
    Report("cudaStreamPerThread is not supported (cudaErrorInvalidResourceHandle)");
    return cudaErrorInvalidResourceHandle;
  }
  auto it = R().streams.find(stream);
  if (it == R().streams.end()) return cudaErrorInvalidResourceHandle;
  *out = it->second;
  return cudaSuccess;
}

// A dependency on `t`'s tail, unless that is already reached without error.
void AddTailDep(const std::shared_ptr<SimStream>& t, std::vector<Position>* deps) {
  std::lock_guard<std::mutex> lock(t->mu);
  if (t->enqueued == 0) return;
  if (t->completed >= t->enqueued && PositionErrorLocked(*t, t->enqueued) == cudaSuccess) return;
  deps->push_back(Position{t, t->enqueued});
}

// Requires R().mu. Queues `work` on `s` after `deps` and the legacy-stream dependencies.
Position EnqueueLocked(const std::shared_ptr<SimStream>& s, std::function<cudaError_t()> work,
                       std::vector<Position> deps) {
  Runtime& r = R();
  if (s->legacy) {
    for (const auto& [handle, t] : r.streams) {
      if (t->blocking && t->device == s->device) AddTailDep(t, &deps);
    }
  } else if (s->blocking && !r.legacy.empty() && r.legacy[s->device] != nullptr) {
    AddTailDep(r.legacy[s->device], &deps);
  }
  std::lock_guard<std::mutex> lock(s->mu);
  Item item;
  item.work = std::move(work);
  item.deps = std::move(deps);
  item.seq = ++s->enqueued;
  s->queue.push_back(std::move(item));
  s->cv.notify_all();
  return Position{s, s->enqueued};
}

cudaError_t EnqueueAt(cudaStream_t stream, std::function<cudaError_t()> work,
                      std::vector<Position> deps, Position* pos) {
  std::lock_guard<std::mutex> lock(R().mu);
  std::shared_ptr<SimStream> s;
  cudaError_t err = ResolveLocked(stream, &s);
  if (err != cudaSuccess) return err;
  Position p = EnqueueLocked(s, std::move(work), std::move(deps));
  if (pos != nullptr) *pos = std::move(p);
  return cudaSuccess;
}

// The tails of `device`'s streams: all of them, or (for the legacy stream's synchronisation)
// the legacy stream and the blocking streams.
std::vector<Position> DeviceTails(int device, bool legacy_and_blocking_only) {
  std::vector<Position> tails;
  std::lock_guard<std::mutex> lock(R().mu);
  Runtime& r = R();
  if (device >= 0 && device < static_cast<int>(r.legacy.size()) && r.legacy[device] != nullptr) {
    tails.push_back(Tail(r.legacy[device]));
  }
  for (const auto& [handle, t] : r.streams) {
    if (t->device == device && (t->blocking || !legacy_and_blocking_only)) {
      tails.push_back(Tail(t));
    }
  }
  return tails;
}

// What a synchronising call on `stream` waits for.
cudaError_t SyncPositions(cudaStream_t stream, std::vector<Position>* out) {
  if (IsLegacyHandle(stream)) {
    *out = DeviceTails(t_device, /*legacy_and_blocking_only=*/true);
    return cudaSuccess;
  }
  std::lock_guard<std::mutex> lock(R().mu);
  std::shared_ptr<SimStream> s;
  cudaError_t err = ResolveLocked(stream, &s);
  if (err == cudaSuccess) out->push_back(Tail(s));
  return err;
}

void AtExit() {
  g_exiting.store(true);
  std::vector<std::shared_ptr<SimStream>> all;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    for (const auto& [handle, s] : R().streams) all.push_back(s);
    for (const auto& s : R().legacy) {
      if (s != nullptr) all.push_back(s);
    }
  }
  for (const auto& s : all) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->cv.notify_all();
  }
  // Workers that leave in time are joined; one still running work is detached (its state is
  // never destroyed).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (const auto& s : all) {
    std::unique_lock<std::mutex> lock(s->mu);
    if (s->claimed) continue;  // a cudaStreamDestroy in progress joins it
    s->claimed = true;
    if (s->cv.wait_until(lock, deadline, [&] { return s->exited; })) {
      lock.unlock();
      s->thread.join();
    } else {
      std::fprintf(stderr, "satdar cuda simulator: a stream was still running work at exit\n");
      s->thread.detach();
      lock.unlock();
      std::lock_guard<std::mutex> r_lock(R().mu);
      R().orphans.push_back(s);  // kept alive for its detached worker
    }
  }
}

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

std::shared_ptr<SimEvent> FindEvent(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(R().mu);
  auto it = R().events.find(event);
  return it == R().events.end() ? nullptr : it->second;
}

Position EventPosition(SimEvent& e) {
  std::lock_guard<std::mutex> lock(e.mu);
  return e.pos;
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

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) {
    return sim::Fail(cudaErrorInvalidValue);
  }
  if (sim::t_device < 0 || sim::t_device >= sim::DeviceCount()) {
    return sim::Fail(cudaErrorNoDevice);
  }
  auto s = sim::NewStream(sim::t_device, false, (flags & cudaStreamNonBlocking) == 0);
  *stream = reinterpret_cast<cudaStream_t>(s.get());
  std::lock_guard<std::mutex> lock(sim::R().mu);
  sim::R().streams[s.get()] = std::move(s);
  return cudaSuccess;
}

// Priorities are accepted and ignored (all streams' workers are equal host threads).
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(stream, flags);
}

// Waits for the stream's queued work, then ends its worker (CUDA returns at once and releases
// the stream later; waiting here keeps the simulator's threads bounded).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (sim::IsLegacyHandle(stream) || stream == cudaStreamPerThread) {
    return sim::Fail(cudaErrorInvalidResourceHandle);
  }
  std::shared_ptr<sim::SimStream> s;
  {
    std::lock_guard<std::mutex> lock(sim::R().mu);
    auto it = sim::R().streams.find(stream);
    if (it == sim::R().streams.end()) return sim::Fail(cudaErrorInvalidResourceHandle);
    s = std::move(it->second);
    sim::R().streams.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->claimed) return cudaSuccess;  // the process is exiting: AtExit ends the worker
    s->claimed = true;
    s->stop = true;
    s->cv.notify_all();
  }
  if (s->thread.get_id() == std::this_thread::get_id()) {
    // From work queued on the stream itself: it cannot wait for itself. The worker ends after
    // the remaining items; the stream is kept alive for it.
    sim::Report("cudaStreamDestroy called from work queued on that stream");
    s->thread.detach();
    std::lock_guard<std::mutex> lock(sim::R().mu);
    sim::R().orphans.push_back(std::move(s));
    return cudaSuccess;
  }
  s->thread.join();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::vector<sim::Position> positions;
  cudaError_t err = sim::SyncPositions(stream, &positions);
  if (err == cudaSuccess) err = sim::WaitAll(positions);
  return sim::Fail(err);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::vector<sim::Position> positions;
  cudaError_t err = sim::SyncPositions(stream, &positions);
  if (err != cudaSuccess) return sim::Fail(err);
  bool pending = false;
  for (const sim::Position& p : positions) {
    cudaError_t e = sim::QueryPosition(p);
    if (e == cudaErrorNotReady) {
      pending = true;
    } else if (e != cudaSuccess) {
      return sim::Fail(e);
    }
  }
  return pending ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (flags != 0) return sim::Fail(cudaErrorInvalidValue);
  std::shared_ptr<sim::SimEvent> e = sim::FindEvent(event);
  if (e == nullptr) return sim::Fail(cudaErrorInvalidResourceHandle);
  std::vector<sim::Position> deps;
  sim::Position pos = sim::EventPosition(*e);  // captured now: a later record does not matter
  if (pos.stream != nullptr) deps.push_back(std::move(pos));
  return sim::Fail(sim::EnqueueAt(stream, nullptr, std::move(deps), nullptr));
}

// Flags (BlockingSync, DisableTiming) are accepted; no timing is kept.
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  constexpr unsigned kKnown = cudaEventBlockingSync | cudaEventDisableTiming;
  if (event == nullptr || (flags & ~kKnown) != 0) return sim::Fail(cudaErrorInvalidValue);
  auto e = std::make_shared<sim::SimEvent>();
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  std::lock_guard<std::mutex> lock(sim::R().mu);
  sim::R().events[e.get()] = std::move(e);
  return cudaSuccess;
}

// Waits already queued on the event keep their captured position.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(sim::R().mu);
  if (sim::R().events.erase(event) == 0) return sim::Fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::shared_ptr<sim::SimEvent> e = sim::FindEvent(event);
  if (e == nullptr) return sim::Fail(cudaErrorInvalidResourceHandle);
  sim::Position pos;
  cudaError_t err = sim::EnqueueAt(stream, nullptr, {}, &pos);
  if (err != cudaSuccess) return sim::Fail(err);
  std::lock_guard<std::mutex> lock(e->mu);
  e->pos = std::move(pos);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::shared_ptr<sim::SimEvent> e = sim::FindEvent(event);
  if (e == nullptr) return sim::Fail(cudaErrorInvalidResourceHandle);
  return sim::Fail(sim::WaitPosition(sim::EventPosition(*e)));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::shared_ptr<sim::SimEvent> e = sim::FindEvent(event);
  if (e == nullptr) return sim::Fail(cudaErrorInvalidResourceHandle);
  return sim::Fail(sim::QueryPosition(sim::EventPosition(*e)));
}
