// core/cuda/sim/runtime_sim_internal.h: what the two parts of the simulated CUDA runtime share:
// runtime_sim.cc (devices, errors, memory, copies, memsets) and runtime_sim_streams.cc (streams,
// their workers, events): the runtime's state, queue positions, and what each part calls of the
// other. Internal to the runtime; the other simulated parts use sim_runtime.h.
#ifndef SATDAR_CORE_CUDA_SIM_RUNTIME_SIM_INTERNAL_H_
#define SATDAR_CORE_CUDA_SIM_RUNTIME_SIM_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace satdar::cuda_sim {

// A stream (its worker thread and queue) and an event, defined in runtime_sim_streams.cc.
struct SimStream;
struct SimEvent;

// A queue position: reached when `stream` has finished its first `seq` items.
struct Position {
  std::shared_ptr<SimStream> stream;
  uint64_t seq = 0;  // 0: nothing to wait for
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

// The calling host thread's current device (cudaSetDevice).
extern thread_local int t_device;

// Defined in runtime_sim.cc.

// Never destroyed: stream workers may still run while static destructors run.
Runtime& R();

// The number of simulated devices (SATDAR_SIM_DEVICES).
int DeviceCount();

// Sets the last error (not for NotReady, as CUDA) and returns `err`.
cudaError_t Fail(cudaError_t err);

// Defined in runtime_sim_streams.cc.

// Blocks until `p` is reached (or the process exits); its stream's error if it failed by then.
cudaError_t WaitPosition(const Position& p);

// Waits for all of `positions`; the first of their errors (in their order), or success.
cudaError_t WaitAll(const std::vector<Position>& positions);

// Queues `work` (empty: a marker) on `stream` after `deps` and the legacy-stream dependencies;
// its position in *pos unless pos is null. An error for a stream that is not a live one.
cudaError_t EnqueueAt(cudaStream_t stream, std::function<cudaError_t()> work,
                      std::vector<Position> deps, Position* pos);

// The tails of `device`'s streams: all of them, or (for the legacy stream's synchronisation)
// the legacy stream and the blocking streams.
std::vector<Position> DeviceTails(int device, bool legacy_and_blocking_only);

// Stops the stream workers at process exit (registered with std::atexit by R()).
void AtExit();

}  // namespace satdar::cuda_sim

#endif  // SATDAR_CORE_CUDA_SIM_RUNTIME_SIM_INTERNAL_H_
