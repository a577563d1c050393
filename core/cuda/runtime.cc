// core/cuda/runtime.h over the CUDA runtime API (compiled by the host compiler), or, without
// a CUDA build, reports that there is no CUDA.
#include "core/cuda/runtime.h"

#include <string>

#include "absl/strings/str_cat.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#endif

namespace satdar::core::cuda {

#ifdef SATDAR_WITH_CUDA

namespace {
int g_error_rank = -1;
}

void SetErrorRank(int rank) { g_error_rank = rank; }

absl::Status CallError(const char* what, const char* call, const char* file, int line) {
  std::string where = absl::StrCat(file, ":", line);
  if (g_error_rank >= 0) absl::StrAppend(&where, " (rank ", g_error_rank, ")");
  return absl::InternalError(absl::StrCat(where, ": ", call, " failed: ", what));
}

bool BuiltWithCuda() { return true; }

#ifdef SATDAR_CUDA_SIM
bool BuiltWithSimulator() { return true; }
#else
bool BuiltWithSimulator() { return false; }
#endif

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" error so later calls do not see it
    return 0;
  }
  return count;
}

absl::StatusOr<void*> Malloc(size_t bytes, int device) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  void* ptr = nullptr;
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
  return ptr;
}

void Free(void* ptr) { cudaFree(ptr); }

absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* dst, const void* src, size_t bytes) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status Synchronize() {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status WaitEvent(void* event) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  return absl::OkStatus();
}

std::string DeviceName(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown GPU";
  return prop.name;
}

#else  // !SATDAR_WITH_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError("satdar was built without CUDA (no nvcc at build time)");
}
}  // namespace

bool BuiltWithCuda() { return false; }
bool BuiltWithSimulator() { return false; }
int DeviceCount() { return 0; }
std::string DeviceName(int device) { return absl::StrCat("no GPU (cuda:", device, ")"); }
absl::StatusOr<void*> Malloc(size_t, int) { return NoCuda(); }
void Free(void*) {}
absl::Status CopyToDevice(void*, const void*, size_t) { return NoCuda(); }
absl::Status CopyToHost(void*, const void*, size_t) { return NoCuda(); }
absl::Status Synchronize() { return NoCuda(); }
absl::Status WaitEvent(void*) { return NoCuda(); }

#endif  // SATDAR_WITH_CUDA

}  // namespace satdar::core::cuda
