#include "core/cuda/stream.h"

#include <utility>

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#endif

namespace satdar::core::cuda {

#ifdef SATDAR_WITH_CUDA

absl::StatusOr<Stream> Stream::Create(int priority) {
  cudaStream_t s = nullptr;
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  return Stream(s);
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status Stream::Wait(const Event& event) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event.get(), 0));
  return absl::OkStatus();
}

absl::Status Stream::Synchronize() {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<bool> Stream::Query() const {
  cudaError_t err = cudaStreamQuery(stream_);
  if (err == cudaErrorNotReady) return false;
  SATDAR_CUDA_RETURN_IF_ERROR(err);
  return true;
}

absl::StatusOr<Event> Event::Create() {
  cudaEvent_t e = nullptr;
  SATDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(e);
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

absl::Status Event::Record(CUstream_st* stream) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Query() const {
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) return false;
  SATDAR_CUDA_RETURN_IF_ERROR(err);
  return true;
}

absl::Status Event::Synchronize() {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::Status StreamWaitStream(CUstream_st* waiter, CUstream_st* producer) {
  absl::StatusOr<Event> e = Event::Create();
  if (!e.ok()) return e.status();
  absl::Status st = e->Record(producer);
  if (!st.ok()) return st;
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(waiter, e->get(), 0));
  return absl::OkStatus();  // destroying a recorded event is safe: the wait is already enqueued
}

#else  // !SATDAR_WITH_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError("satdar was built without CUDA (no nvcc at build time)");
}
}  // namespace

absl::StatusOr<Stream> Stream::Create(int) { return NoCuda(); }
Stream::~Stream() {}
absl::Status Stream::Wait(const Event&) { return NoCuda(); }
absl::Status Stream::Synchronize() { return NoCuda(); }
absl::StatusOr<bool> Stream::Query() const { return NoCuda(); }
absl::StatusOr<Event> Event::Create() { return NoCuda(); }
Event::~Event() {}
absl::Status Event::Record(CUstream_st*) { return NoCuda(); }
absl::StatusOr<bool> Event::Query() const { return NoCuda(); }
absl::Status Event::Synchronize() { return NoCuda(); }
absl::Status StreamWaitStream(CUstream_st*, CUstream_st*) { return NoCuda(); }

#endif  // SATDAR_WITH_CUDA

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream tmp(std::move(*this));  // destroys the old stream
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}
Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event tmp(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

}  // namespace satdar::core::cuda
