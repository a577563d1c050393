// core/cuda/sim/nccl_sim_collectives.h: the NCCL simulator's operations on streams
// (nccl_sim_collectives.cc): the collectives and Send/Recv of a communicator, their checks, and
// the calling thread's open group.
#ifndef SATDAR_CORE_CUDA_SIM_NCCL_SIM_COLLECTIVES_H_
#define SATDAR_CORE_CUDA_SIM_NCCL_SIM_COLLECTIVES_H_

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/cuda/sim/nccl_sim_internal.h"

namespace satdar::cuda_sim {

enum OpKind : int32_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv };

// 0 for the types the simulator does not implement.
size_t TypeSize(int32_t t);

struct Op {
  OpKind kind;
  std::shared_ptr<CommState> comm;
  cudaStream_t stream;
  const void* send;
  void* recv;
  size_t count;  // elements: per rank (ReduceScatter: received; AllGather: sent)
  int32_t type;
  int32_t red;
  int peer;  // Broadcast: the root; Send/Recv: the peer
  uint64_t seq = 0;
  size_t bytes() const { return count * TypeSize(type); }
};

// The calling thread's open group (ncclGroupStart .. ncclGroupEnd).
extern thread_local int t_group_depth;
extern thread_local std::vector<Op> t_group_ops;
extern thread_local ncclResult_t t_group_error;

// Queues the operations, one stream work per (communicator, stream), in issue order; numbers
// them as the peers will.
ncclResult_t Launch(std::vector<Op> ops);

// Checks that `comm` can take an operation now.
ncclResult_t CheckReady(const char* call, ncclComm_t comm);

// Checks and queues (or, inside a group, defers) one operation.
ncclResult_t Submit(const char* call, Op op, ncclComm_t comm);

}  // namespace satdar::cuda_sim

#endif  // SATDAR_CORE_CUDA_SIM_NCCL_SIM_COLLECTIVES_H_
