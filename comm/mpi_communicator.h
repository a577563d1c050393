// comm/mpi_communicator.h: the Communicator over MPI (Open MPI), for CPU ranks launched
// by mpirun. Every operation is a set of non-blocking point-to-point transfers with the peers
// it involves (collectives too: a direct exchange, as in the Gloo communicator), issued from
// the calling thread; Wait() polls them up to the timeout, so a dead, stopped or stuck peer
// gives DeadlineExceeded naming the ranks that never arrived, rather than a hang. After a
// failure the communicator is broken: other pending operations give up at once.
// Reductions gather every rank's contribution and add them in rank order, so all ranks get
// bit-identical results.
// REQUIRES: one thread at a time issues and waits (MPI_THREAD_SERIALIZED).
#ifndef SATDAR_COMM_MPI_COMMUNICATOR_H_
#define SATDAR_COMM_MPI_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace satdar::comm {

// Initialises MPI (once per process) and returns the world communicator.
absl::StatusOr<std::unique_ptr<Communicator>> MpiWorld(int* argc, char*** argv);
// MPI_Finalize; call after every communicator is destroyed. It waits for every rank, so a
// process whose run failed (a peer may be stopped or gone) calls MpiAbort instead.
void MpiFinalize();
// Ends every process of the job (MPI_Abort; mpirun exits with exit_code), this one included.
[[noreturn]] void MpiAbort(int exit_code);

}  // namespace satdar::comm

#endif  // SATDAR_COMM_MPI_COMMUNICATOR_H_
