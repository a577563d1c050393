// core/cuda/sim/sim_runtime.h: what the simulated runtime (runtime_sim.cc) offers the other
// simulated parts: kernels (kernel_sim.cc), cuBLASLt (cublaslt_sim.cc) and NCCL
// (nccl_sim_collectives.cc). Each of them queues its work on a stream and checks device
// pointers here.
#ifndef SATDAR_CORE_CUDA_SIM_SIM_RUNTIME_H_
#define SATDAR_CORE_CUDA_SIM_SIM_RUNTIME_H_

#include <cstddef>
#include <functional>
#include <string>

#include <cuda_runtime.h>

namespace satdar::cuda_sim {

// Appends `work` to `stream`'s queue (0, cudaStreamLegacy: the legacy default stream, which
// orders itself with every blocking stream, as CUDA's does) and returns at once. The stream's
// own host thread runs queued work in order. `work` returns cudaSuccess, or an error that
// becomes the stream's sticky error (returned by the next synchronising call on it, and by
// cudaGetLastError of the thread that then synchronises), as a kernel fault does on a device.
// InvalidResourceHandle (returned, nothing queued) for a stream that is not a live one.
cudaError_t Enqueue(cudaStream_t stream, std::function<cudaError_t()> work);

// Sets the calling host thread's last error (cudaGetLastError returns and clears it), as a
// failed launch does on a device.
void SetLastError(cudaError_t error);

// Whether [ptr, ptr + bytes) lies inside one live cudaMalloc allocation.
bool IsDeviceRange(const void* ptr, size_t bytes);

// Reports a simulator-detected misuse (a divergent barrier, an unsupported cuBLASLt attribute,
// a device pointer read on the host, ...) on stderr with `what`, once per message text.
void Report(const std::string& what);

}  // namespace satdar::cuda_sim

#endif  // SATDAR_CORE_CUDA_SIM_SIM_RUNTIME_H_
