// core/cuda/check.h: the one checked-call macro for CUDA runtime, cuBLAS and NCCL calls made
// from host code. On failure it returns an absl::Status naming the call, file, line and the
// rank of this process (when SetErrorRank was called). Include only under SATDAR_WITH_CUDA.
#ifndef SATDAR_CORE_CUDA_CHECK_H_
#define SATDAR_CORE_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace satdar::core::cuda {

// Rank printed in error messages; set once by the launcher (-1 = single process, not printed).
void SetErrorRank(int rank);
absl::Status CallError(const char* what, const char* call, const char* file, int line);
inline const char* ErrorText(cudaError_t err) { return cudaGetErrorString(err); }

// The error of a failed call made for one rank of a communicator (NCCL): names the call, file,
// line and that rank, which may differ from the process's rank given to SetErrorRank.
inline absl::Status RankCallError(const char* what, const char* call, const char* file, int line,
                                  int rank) {
  return absl::InternalError(
      absl::StrCat(file, ":", line, " (rank ", rank, "): ", call, " failed: ", what));
}

}  // namespace satdar::core::cuda

// Works for any API whose success value and to-string function are given.
#define SATDAR_GPU_RETURN_IF_ERROR(call, success, to_string)                                   \
  do {                                                                                          \
    auto satdar_gpu_err_ = (call);                                                              \
    if (satdar_gpu_err_ != (success))                                                           \
      return ::satdar::core::cuda::CallError(to_string(satdar_gpu_err_), #call, __FILE__,      \
                                              __LINE__);                                        \
  } while (0)

#define SATDAR_CUDA_RETURN_IF_ERROR(call) \
  SATDAR_GPU_RETURN_IF_ERROR(call, cudaSuccess, ::satdar::core::cuda::ErrorText)

// NCCL calls (include <nccl.h> first): any result but ncclSuccess is an error naming the call,
// file, line and `rank` (the communicator's rank), with NCCL's own last-error text. A
// non-blocking communicator's ncclInProgress must be settled by the caller, not passed here.
#define SATDAR_NCCL_RETURN_IF_ERROR(call, rank)                                                \
  do {                                                                                          \
    ncclResult_t satdar_nccl_err_ = (call);                                                     \
    if (satdar_nccl_err_ != ncclSuccess)                                                        \
      return ::satdar::core::cuda::RankCallError(                                               \
          ::absl::StrCat(ncclGetErrorString(satdar_nccl_err_), " (", ncclGetLastError(nullptr), \
                         ")")                                                                   \
              .c_str(),                                                                         \
          #call, __FILE__, __LINE__, (rank));                                                   \
  } while (0)

#endif  // SATDAR_CORE_CUDA_CHECK_H_
