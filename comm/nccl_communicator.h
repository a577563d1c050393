// comm/nccl_communicator.h: the Communicator over NCCL, for ranks that each own one GPU.
// Every pointer handed to it is device memory of that rank's GPU.
//
//   NcclOptions o;
//   o.rank = r;
//   o.world_size = n;
//   o.store_dir = "/shared/job42";   // rank 0 publishes the ncclUniqueId here
//   SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, NcclWorld(o));
//   SATDAR_RETURN_IF_ERROR(world->AllReduce(d_grads, n, DType::kF32, ReduceOp::kSum, {})->Wait());
//
// Each communicator (the world and every Split) has its own non-blocking CUDA stream and its own
// non-blocking NCCL communicator. A call enqueues the NCCL operation on that stream and returns
// a Work backed by a CUDA event; Wait() polls the event and ncclCommGetAsyncError until it
// completes, and at the timeout aborts the communicator (ncclCommAbort) and returns
// DeadlineExceeded. NCCL cannot say which peer is missing, so the message cannot name it.
// After any failure the communicator is aborted: later calls fail at once (FailedPrecondition).
//
// Differences from LocalCommunicator, MpiCommunicator and GlooCommunicator (be aware):
// - Reductions are NOT added in rank order. NCCL reduces in the order of its ring or tree
//   (which depends on the topology, the number of channels, NCCL_ALGO/NCCL_PROTO and the NCCL
//   version), so float results differ in the last bits from the other implementations and may
//   change between machines or NCCL versions. With NCCL's ring and tree algorithms every rank
//   of an AllReduce receives the same bits (each element is reduced once, then copied to all
//   ranks), and a fixed machine, NCCL version and NCCL_ALGO=Ring NCCL_PROTO=Simple give the
//   same bits run to run; this is NCCL's behaviour, not something this class enforces. Where
//   rank order matters, AllGather the contributions and add them locally.
// - Data must be ready when the call is made: the communicator's stream does not wait for the
//   stream that produced it (synchronize that stream first). Wait() returns once the result is
//   in device memory.
// - Tags are ignored: Send/Recv between a pair of ranks match in issue order. Consecutive
//   Send/Recv calls are grouped (ncclGroupStart/End) and enqueued when something else is
//   issued or one of them is waited on, so a ring of Send-then-Recv does not deadlock; with
//   CollectiveOptions::enqueue_now a call (and those pending) is enqueued at once. A Send
//   completes only once its Recv is posted, and the operations of one communicator run in
//   order on its stream.
// - bf16 reductions are supported (NCCL's); u16 is not reducible.
// Calls make the communicator's device the calling thread's current CUDA device.
// REQUIRES: one thread at a time issues and waits.
#ifndef SATDAR_COMM_NCCL_COMMUNICATOR_H_
#define SATDAR_COMM_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/kv_store.h"

namespace satdar::comm {

struct NcclOptions {
  int rank = -1;       // 0 <= rank < world_size
  int world_size = 0;  // >= 1
  int device = -1;     // this rank's CUDA device; -1: rank % (number of visible devices)
  // Where rank 0 publishes the NCCL unique id: a FileKvStore directory, or any KvStore.
  std::string store_dir;
  std::shared_ptr<KvStore> store;
  std::string prefix;  // namespace of this job's keys in the store
  // How long to wait for rank 0's id and for every rank to join (ncclCommInitRank, Split).
  absl::Duration timeout = absl::Seconds(300);
};

// True when satdar was built with NCCL (the CUDA toolkit had nccl.h and libnccl.so).
bool NcclBuilt();

// Joins the world. FailedPrecondition without an NCCL build or a GPU; InvalidArgument for a
// bad rank, world size or device; DeadlineExceeded when rank 0's id or some rank did not come
// within options.timeout; Unavailable when the store cannot be reached.
absl::StatusOr<std::unique_ptr<Communicator>> NcclWorld(const NcclOptions& options);

}  // namespace satdar::comm

#endif  // SATDAR_COMM_NCCL_COMMUNICATOR_H_
