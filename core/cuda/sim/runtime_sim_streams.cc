// core/cuda/sim/runtime_sim_streams.cc: the simulated CUDA runtime's streams, their worker
// threads, events and synchronisation, on the CPU (devices, memory and errors are in
// runtime_sim.cc; what the two share is in runtime_sim_internal.h).
//
// Model (docs/GPU.md has the user-facing summary; runtime_sim.cc has devices and memory):
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
//   is never destroyed, so workers never see destroyed statics of the runtime.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/sim/runtime_sim_internal.h"
#include "core/cuda/sim/sim_runtime.h"

namespace satdar::cuda_sim {

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

namespace {

std::atomic<bool> g_exiting{false};

cudaError_t PositionErrorLocked(const SimStream& s, uint64_t seq) {
  return s.error != cudaSuccess && s.error_seq <= seq ? s.error : cudaSuccess;
}

}  // namespace

// Blocks until `p` is reached (or the process exits); its stream's error if it failed by then.
cudaError_t WaitPosition(const Position& p) {
  if (p.stream == nullptr || p.seq == 0) return cudaSuccess;
  SimStream& s = *p.stream;
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return s.completed >= p.seq || g_exiting.load(); });
  return PositionErrorLocked(s, p.seq);
}

cudaError_t WaitAll(const std::vector<Position>& positions) {
  cudaError_t result = cudaSuccess;
  for (const Position& p : positions) {
    cudaError_t err = WaitPosition(p);
    if (result == cudaSuccess) result = err;
  }
  return result;
}

namespace {

// NotReady, the position's error, or success.
cudaError_t QueryPosition(const Position& p) {
  if (p.stream == nullptr || p.seq == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(p.stream->mu);
  if (p.stream->completed < p.seq) return cudaErrorNotReady;
  return PositionErrorLocked(*p.stream, p.seq);
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

}  // namespace

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

namespace {

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
}  // namespace satdar::cuda_sim

namespace sim = ::satdar::cuda_sim;

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
