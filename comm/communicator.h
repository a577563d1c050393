// comm/communicator.h: how ranks talk to each other. Models and schedules reach other
// ranks only through this interface; implementations: LocalCommunicator (threads of one
// process, for tests; local_communicator.h), MpiCommunicator (mpirun launches),
// GlooCommunicator (TCP, ranks started by hand or a scheduler, meeting through a KvStore)
// and NcclCommunicator (GPUs; its reductions follow NCCL's ring order, not rank order).
//
//   std::unique_ptr<Work> w = comm->AllReduce(grads, n, DType::kF32, ReduceOp::kSum, {});
//   SATDAR_RETURN_IF_ERROR(w->Wait());   // DeadlineExceeded names the ranks that never came
//
// Every call returns at once with a Work handle; the operation runs asynchronously and Wait()
// returns its Status. Operations of one communicator run in the order they were issued, and
// every rank must issue the same collectives in the same order. Reductions add the ranks'
// contributions in rank order, so every rank gets bit-identical results, and the same results
// on every run.
#ifndef SATDAR_COMM_COMMUNICATOR_H_
#define SATDAR_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/dtype.h"

namespace satdar::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

struct CollectiveOptions {
  // A peer that does not arrive within this time fails the operation (never a hang).
  absl::Duration timeout = absl::Seconds(300);
  // NCCL only (others ignore it): a CUDA event (cudaEvent_t) recorded after the work that
  // produces the data; the communicator's stream waits for it instead of the caller
  // synchronising, so the operation overlaps whatever is enqueued after the event.
  void* ready_event = nullptr;
  // NCCL only (the others start a Send or Recv at once anyway): enqueue this Send or Recv, and
  // those still pending before it, now instead of grouping it with the next call. Needed
  // where nothing else would come to flush it: a communicator on which this rank only sends
  // (parallel/pipeline.h's directed links).
  bool enqueue_now = false;
};

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation finished; its outcome.
  virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data (count) is reduced over all ranks in place.
  virtual std::unique_ptr<Work> AllReduce(void* data, size_t count, core::DType dtype,
                                          ReduceOp op, const CollectiveOptions& options) = 0;
  // in (size * count): rank r receives the reduction of every rank's block r into out (count).
  virtual std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count,
                                              core::DType dtype, ReduceOp op,
                                              const CollectiveOptions& options) = 0;
  // in (count) of every rank, concatenated in rank order into out (size * count).
  virtual std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count,
                                          core::DType dtype, const CollectiveOptions& options) = 0;
  virtual std::unique_ptr<Work> Broadcast(void* data, size_t count, core::DType dtype, int root,
                                          const CollectiveOptions& options) = 0;
  // in: send_counts[p] elements for each peer p, back to back; out: recv_counts[p] from each.
  virtual std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts,
                                          void* out, const std::vector<size_t>& recv_counts,
                                          core::DType dtype, const CollectiveOptions& options) = 0;
  // Point to point; messages between a pair of ranks with the same tag arrive in order.
  virtual std::unique_ptr<Work> Send(const void* data, size_t count, core::DType dtype, int peer,
                                     int tag, const CollectiveOptions& options) = 0;
  virtual std::unique_ptr<Work> Recv(void* data, size_t count, core::DType dtype, int peer,
                                     int tag, const CollectiveOptions& options) = 0;
  virtual std::unique_ptr<Work> Barrier(const CollectiveOptions& options) = 0;

  // Like MPI_Comm_split: ranks with the same color form a new communicator, ordered by
  // (key, old rank). Every rank must call it (a collective).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                              const CollectiveOptions& options) = 0;
};

}  // namespace satdar::comm

#endif  // SATDAR_COMM_COMMUNICATOR_H_
