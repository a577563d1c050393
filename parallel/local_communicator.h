// parallel/local_communicator.h: a Communicator over the threads of one process, with the
// real semantics (ordering, deterministic rank-order reductions, timeouts): the test double
// of the MPI, Gloo and NCCL implementations, and a way to run several ranks in one process.
//
//   auto comms = MakeLocalCommunicators(4);
//   // thread r: comms[r]->AllReduce(...)->Wait();
#ifndef SATDAR_PARALLEL_LOCAL_COMMUNICATOR_H_
#define SATDAR_PARALLEL_LOCAL_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace satdar::parallel {

// One communicator per rank of a new group of `size` ranks.
std::vector<std::unique_ptr<Communicator>> MakeLocalCommunicators(int size);

}  // namespace satdar::parallel

#endif  // SATDAR_PARALLEL_LOCAL_COMMUNICATOR_H_
