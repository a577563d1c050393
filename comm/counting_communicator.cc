#include "comm/counting_communicator.h"

#include <chrono>

namespace satdar::comm {

namespace {

int64_t NanosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

// Adds the time a rank spends blocked in Wait to a counter.
class TimedWork : public Work {
 public:
  TimedWork(std::unique_ptr<Work> inner, std::atomic<int64_t>* ns)
      : inner_(std::move(inner)), ns_(ns) {}
  absl::Status Wait() override {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = inner_->Wait();
    *ns_ += NanosSince(t0);
    return s;
  }

 private:
  std::unique_ptr<Work> inner_;
  std::atomic<int64_t>* ns_;
};

}  // namespace

// A template, not a std::function: a collective's call must not allocate to be timed.
template <typename Call>
std::unique_ptr<Work> CountingCommunicator::Timed(Call call) {
  // A backend may do the work in the call (synchronously) or in Wait: both count.
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Work> w = call();
  wait_ns_ += NanosSince(t0);
  if (w == nullptr) return w;
  return std::make_unique<TimedWork>(std::move(w), &wait_ns_);
}

std::unique_ptr<Work> CountingCommunicator::AllReduce(void* data, size_t count, core::DType dtype,
                                                      ReduceOp op,
                                                      const CollectiveOptions& options) {
  Add(count, dtype);
  return Timed([&] { return inner_->AllReduce(data, count, dtype, op, options); });
}

std::unique_ptr<Work> CountingCommunicator::ReduceScatter(const void* in, void* out, size_t count,
                                                          core::DType dtype, ReduceOp op,
                                                          const CollectiveOptions& options) {
  Add(count * static_cast<size_t>(size()), dtype);
  return Timed([&] { return inner_->ReduceScatter(in, out, count, dtype, op, options); });
}

std::unique_ptr<Work> CountingCommunicator::AllGather(const void* in, void* out, size_t count,
                                                      core::DType dtype,
                                                      const CollectiveOptions& options) {
  Add(count, dtype);
  return Timed([&] { return inner_->AllGather(in, out, count, dtype, options); });
}

std::unique_ptr<Work> CountingCommunicator::Broadcast(void* data, size_t count, core::DType dtype,
                                                      int root, const CollectiveOptions& options) {
  if (rank() == root) Add(count, dtype);
  return Timed([&] { return inner_->Broadcast(data, count, dtype, root, options); });
}

std::unique_ptr<Work> CountingCommunicator::AllToAllV(const void* in,
                                                      const std::vector<size_t>& send_counts,
                                                      void* out,
                                                      const std::vector<size_t>& recv_counts,
                                                      core::DType dtype,
                                                      const CollectiveOptions& options) {
  for (size_t p = 0; p < send_counts.size(); ++p) {
    if (static_cast<int>(p) != rank()) Add(send_counts[p], dtype);
  }
  return Timed([&] { return inner_->AllToAllV(in, send_counts, out, recv_counts, dtype, options); });
}

std::unique_ptr<Work> CountingCommunicator::Send(const void* data, size_t count, core::DType dtype,
                                                 int peer, int tag,
                                                 const CollectiveOptions& options) {
  Add(count, dtype);
  return Timed([&] { return inner_->Send(data, count, dtype, peer, tag, options); });
}

std::unique_ptr<Work> CountingCommunicator::Recv(void* data, size_t count, core::DType dtype,
                                                 int peer, int tag,
                                                 const CollectiveOptions& options) {
  return Timed([&] { return inner_->Recv(data, count, dtype, peer, tag, options); });
}

std::unique_ptr<Work> CountingCommunicator::Barrier(const CollectiveOptions& options) {
  return Timed([&] { return inner_->Barrier(options); });
}

absl::StatusOr<std::unique_ptr<Communicator>> CountingCommunicator::Split(
    int color, int key, const CollectiveOptions& options) {
  return inner_->Split(color, key, options);
}

}  // namespace satdar::comm
