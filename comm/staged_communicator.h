// comm/staged_communicator.h: a Communicator for device buffers that moves them through
// host memory and a host communicator (Gloo, MPI, in-process). Several ranks can then share
// one GPU, which NCCL refuses ("duplicate GPU"): the layout tests run dp, tp, pp and ep with
// two ranks on one GPU against one GPU rank. It is slow (every call copies its buffers both
// ways and synchronises) and exact (reductions in the host communicator's rank order).
//
//   DeviceCopier copier = core::cuda::...;          // or HostCopier() in tests
//   SATDAR_ASSIGN_OR_RETURN(auto host, gloo_world->Split(0, rank, opts));
//   std::unique_ptr<Communicator> device = StageThroughHost(std::move(host), copier);
//   device->AllReduce(d_grads, n, DType::kF32, ReduceOp::kAvg, {})->Wait();
//
// A call waits for options.ready_event (when set) before it reads device memory, copies the
// input to a host buffer and issues the host collective; the Work's Wait() waits for it and
// copies the result back, so the result is in device memory when Wait() returns (as NCCL's
// Work). Split wraps the host communicator's split with the same copier.
#ifndef SATDAR_COMM_STAGED_COMMUNICATOR_H_
#define SATDAR_COMM_STAGED_COMMUNICATOR_H_

#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace satdar::comm {

// How staged buffers reach host memory and back. Each call returns once the bytes are where
// they were asked to be (to_device: visible to every later kernel of the device).
struct DeviceCopier {
  std::function<absl::Status(void* host, const void* device, size_t bytes)> to_host;
  std::function<absl::Status(void* device, const void* host, size_t bytes)> to_device;
  // Blocks until a CollectiveOptions::ready_event has happened; empty: events are ignored.
  std::function<absl::Status(void* event)> wait_event;
};

// "Device" memory that is host memory (memcpy): the staging logic under test on machines
// without a GPU, and nothing else.
DeviceCopier HostCopier();

// The GPU's: cudaMemcpy both ways, then a device synchronisation after each copy to the device
// (a copy from pageable memory may return before it lands); events by cudaEventSynchronize.
// Every call fails with FailedPrecondition in a build without CUDA.
DeviceCopier CudaCopier();

std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> host,
                                               DeviceCopier copier);

}  // namespace satdar::comm

#endif  // SATDAR_COMM_STAGED_COMMUNICATOR_H_
