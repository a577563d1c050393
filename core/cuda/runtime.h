// core/cuda/runtime.h: the few CUDA runtime calls the rest of core needs, callable from code
// compiled without nvcc. Without a CUDA build every function reports "no CUDA".
#ifndef SATDAR_CORE_CUDA_RUNTIME_H_
#define SATDAR_CORE_CUDA_RUNTIME_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace satdar::core::cuda {

bool BuiltWithCuda();
// Whether this is the CUDA simulator build (--repo_env=SATDAR_CUDA=sim): kernels, cuBLASLt
// and NCCL run on the CPU (core/cuda/sim).
bool BuiltWithSimulator();
// Number of visible GPUs; 0 when there is no driver or no device.
int DeviceCount();
// The device's marketing name ("NVIDIA H200"), or a placeholder when it cannot be read.
std::string DeviceName(int device);
absl::StatusOr<void*> Malloc(size_t bytes, int device);
void Free(void* ptr);
absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);
absl::Status CopyToHost(void* dst, const void* src, size_t bytes);
absl::Status Synchronize();
// Blocks until a cudaEvent_t (passed as void*) has happened.
absl::Status WaitEvent(void* event);

}  // namespace satdar::core::cuda

#endif  // SATDAR_CORE_CUDA_RUNTIME_H_
