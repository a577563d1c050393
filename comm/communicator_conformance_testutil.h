// comm/communicator_conformance_testutil.h: the closed-form checks every Communicator must
// pass (in the style of c10d's and nccl-tests' tests), shared by the tests of the in-process,
// MPI, Gloo and NCCL implementations. Run it on every rank of a group at once (threads or
// processes); failures are reported through gtest on the rank that saw them.
//
//   // on each rank r of n:
//   RunCommunicatorConformance(comm, r, n);
//
// It checks every collective against closed forms, that float reductions are bit-identical
// on every rank (and, with rank_order_reductions, equal to adding in rank order), Work handles
// waited out of issue order, Send/Recv ordering and tags, uneven and empty AllToAllV blocks,
// Split (key order, ties, nested, the mesh groups when n == 4) and, last, a Recv that times out.
// The timeout case may leave the communicator unusable (Gloo, NCCL): run it last.
#ifndef SATDAR_COMM_COMMUNICATOR_CONFORMANCE_TESTUTIL_H_
#define SATDAR_COMM_COMMUNICATOR_CONFORMANCE_TESTUTIL_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "comm/communicator.h"

namespace satdar::comm {

// Where the buffers handed to the communicator live. All empty: host memory.
struct ConformanceMemory {
  std::function<void*(size_t bytes)> alloc;
  std::function<void(void* ptr)> free;
  std::function<void(void* device, const void* host, size_t bytes)> to_device;
  std::function<void(void* host, const void* device, size_t bytes)> to_host;
};

struct ConformanceOptions {
  // Reductions add in rank order (LocalCommunicator, MPI, Gloo); NCCL adds in its ring/tree
  // order, so for it only agreement between ranks and closeness are checked.
  bool rank_order_reductions = true;
  // Messages of different tags between a pair are matched by tag (NCCL matches by order only).
  bool tags_match = true;
  // The timeout's message names the peer it waited for (MPI's does not).
  bool timeout_names_peer = true;
  bool run_timeout_case = true;
  absl::Duration timeout = absl::Milliseconds(300);
  ConformanceMemory memory;
};

// Buffers in this GPU's memory (cudaMalloc, cudaMemcpy); failures are gtest failures.
ConformanceMemory CudaMemory(int device);

// Runs body(rank, comm) on one thread per rank and joins them.
void OnRanks(std::vector<std::unique_ptr<Communicator>>& comms,
             const std::function<void(int rank, Communicator* comm)>& body);

void RunCommunicatorConformance(Communicator* comm, int rank, int size,
                                const ConformanceOptions& options = {});

}  // namespace satdar::comm

#endif  // SATDAR_COMM_COMMUNICATOR_CONFORMANCE_TESTUTIL_H_
