// comm/local_communicator.h: a Communicator over the threads of one process, with the
// real semantics (ordering, deterministic rank-order reductions, timeouts): the test double
// of the MPI, Gloo and NCCL implementations, and a way to run several ranks in one process.
//
//   auto comms = MakeLocalCommunicators(4);
//   // thread r: comms[r]->AllReduce(...)->Wait();
#ifndef SATDAR_COMM_LOCAL_COMMUNICATOR_H_
#define SATDAR_COMM_LOCAL_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace satdar::comm {

// One communicator per rank of a new group of `size` ranks.
std::vector<std::unique_ptr<Communicator>> MakeLocalCommunicators(int size);

}  // namespace satdar::comm

#endif  // SATDAR_COMM_LOCAL_COMMUNICATOR_H_
