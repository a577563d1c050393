// comm/counting_communicator.h: a Communicator that passes every call to another one and
// counts the payload bytes this rank hands to it (an all-reduce of n bytes counts n, an
// all-to-all the bytes bound for other ranks, a send its message, a receive nothing), so a
// training log can say how much each group moves per step whatever algorithm moves it, and
// the time this rank spends blocked in the group's calls and Waits.
#ifndef SATDAR_COMM_COUNTING_COMMUNICATOR_H_
#define SATDAR_COMM_COUNTING_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace satdar::comm {

class CountingCommunicator : public Communicator {
 public:
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  // Bytes counted since the last call (and resets the count).
  int64_t TakeBytes() { return bytes_.exchange(0); }
  // Seconds this rank spent inside this group's calls and their Waits since the last call
  // (and resets it): the time the step waited on communication.
  double TakeWaitSeconds() { return wait_ns_.exchange(0) * 1e-9; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<Work> AllReduce(void* data, size_t count, core::DType dtype, ReduceOp op,
                                  const CollectiveOptions& options) override;
  std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count, core::DType dtype,
                                      ReduceOp op, const CollectiveOptions& options) override;
  std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count, core::DType dtype,
                                  const CollectiveOptions& options) override;
  std::unique_ptr<Work> Broadcast(void* data, size_t count, core::DType dtype, int root,
                                  const CollectiveOptions& options) override;
  std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts,
                                  void* out, const std::vector<size_t>& recv_counts,
                                  core::DType dtype, const CollectiveOptions& options) override;
  std::unique_ptr<Work> Send(const void* data, size_t count, core::DType dtype, int peer, int tag,
                             const CollectiveOptions& options) override;
  std::unique_ptr<Work> Recv(void* data, size_t count, core::DType dtype, int peer, int tag,
                             const CollectiveOptions& options) override;
  std::unique_ptr<Work> Barrier(const CollectiveOptions& options) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      const CollectiveOptions& options) override;

 private:
  void Add(size_t count, core::DType dtype) {
    bytes_ += static_cast<int64_t>(count * core::DTypeSize(dtype));
  }
  // call() -> std::unique_ptr<Work>, timed (defined in the .cc, its only user).
  template <typename Call>
  std::unique_ptr<Work> Timed(Call call);
  std::unique_ptr<Communicator> inner_;
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> wait_ns_{0};
};

}  // namespace satdar::comm

#endif  // SATDAR_COMM_COUNTING_COMMUNICATOR_H_
