// core/cuda/stream.h: RAII CUDA streams and events, for overlapping communication with compute
// (e.g. record an event after a gradient bucket's backward on the compute stream, make the
// communication stream wait on it, all-reduce there, and query/wait for that stream's event
// before the optimizer). Without a CUDA build, Create returns FailedPrecondition.
#ifndef SATDAR_CORE_CUDA_STREAM_H_
#define SATDAR_CORE_CUDA_STREAM_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct CUstream_st;  // cudaStream_t
struct CUevent_st;   // cudaEvent_t

namespace satdar::core::cuda {

class Event;

// An owned stream (non-blocking with respect to the legacy default stream).
class Stream {
 public:
  // `priority`: CUDA stream priority (lower is higher priority; 0 the default).
  static absl::StatusOr<Stream> Create(int priority = 0);
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream_st* get() const { return stream_; }
  // Work submitted to this stream after this call waits for `event`'s recorded work.
  absl::Status Wait(const Event& event);
  absl::Status Synchronize();
  // True when all submitted work has completed.
  absl::StatusOr<bool> Query() const;

 private:
  explicit Stream(CUstream_st* s) : stream_(s) {}
  CUstream_st* stream_ = nullptr;
};

// An owned event (timing disabled: cheaper to record and wait on).
class Event {
 public:
  static absl::StatusOr<Event> Create();
  Event() = default;
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent_st* get() const { return event_; }
  // Captures the work submitted so far to `stream` (nullptr: the legacy default stream).
  absl::Status Record(CUstream_st* stream);
  absl::Status Record(const Stream& stream) { return Record(stream.get()); }
  // True once the recorded work has completed (also for a never-recorded event).
  absl::StatusOr<bool> Query() const;
  // Blocks the host until the recorded work has completed.
  absl::Status Synchronize();

 private:
  explicit Event(CUevent_st* e) : event_(e) {}
  CUevent_st* event_ = nullptr;
};

// `waiter` waits for everything submitted so far to `producer` (records a temporary event).
absl::Status StreamWaitStream(CUstream_st* waiter, CUstream_st* producer);

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_CUDA_STREAM_H_
