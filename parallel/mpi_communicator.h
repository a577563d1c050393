// parallel/mpi_communicator.h: the Communicator over MPI (Open MPI), for CPU ranks launched
// by mpirun. Operations are issued non-blocking (MPI_I*) from the calling thread and Wait()
// polls them up to the timeout, so a dead peer gives DeadlineExceeded rather than a hang.
// Reductions gather every rank's contribution and add them in rank order, so all ranks get
// bit-identical results whatever algorithm the MPI library picks.
// REQUIRES: one thread at a time issues and waits (MPI_THREAD_SERIALIZED).
#ifndef SATDAR_PARALLEL_MPI_COMMUNICATOR_H_
#define SATDAR_PARALLEL_MPI_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace satdar::parallel {

// Initialises MPI (once per process) and returns the world communicator.
absl::StatusOr<std::unique_ptr<Communicator>> MpiWorld(int* argc, char*** argv);
// MPI_Finalize; call after every communicator is destroyed.
void MpiFinalize();

}  // namespace satdar::parallel

#endif  // SATDAR_PARALLEL_MPI_COMMUNICATOR_H_
