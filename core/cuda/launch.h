// core/cuda/launch.h: the one way a .cu file launches a kernel, for nvcc and for the CUDA
// simulator build alike (no `<<<...>>>` at call sites):
//
//   return Launch("ForwardKernel", ForwardKernel<T>, dim3(n), dim3(kRowThreads), smem, stream,
//                 out, alpha, x, w, c);
//   return Launch("DqKernel", DqKernel<T, kTile>, LaunchBounds{kTile}, grid, dim3(kTile), 0,
//                 stream, dq, dout, lse, q, k, v, n, t, hs, scale);
//
// Before launching it checks the configuration as the device does (threads per block and
// per dimension, grid limits, dynamic shared memory against the default 48 KiB or, for more,
// the H200's opt-in limit of 227 KiB, and the kernel's __launch_bounds__, passed as
// LaunchBounds where the kernel declares one), and returns cudaErrorInvalidConfiguration /
// cudaErrorInvalidValue without launching when it is wrong; after launching it returns
// cudaGetLastError(). Kernel parameters are taken by value, converted to the kernel's
// parameter types, as a `<<<...>>>` launch does.
//
// Inside a kernel, dynamic shared memory is declared with SATDAR_DYNAMIC_SHARED(float, name);
// (CUDA's `extern __shared__ float name[];`).
#ifndef SATDAR_CORE_CUDA_LAUNCH_H_
#define SATDAR_CORE_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#if defined(SATDAR_CUDA_SIM)
#include "core/cuda/sim/kernel_sim.h"
#endif

namespace satdar::core::cuda {

// A kernel's __launch_bounds__(max_threads).
struct LaunchBounds {
  int max_threads;
};

// The device limits Launch checks against (an H200: compute capability 9.0).
inline constexpr unsigned kMaxThreadsPerBlock = 1024;
inline constexpr unsigned kMaxBlockDimZ = 64;
inline constexpr unsigned kMaxGridDimX = 2147483647u;
inline constexpr unsigned kMaxGridDimYZ = 65535;
inline constexpr size_t kDefaultSharedBytes = 48 * 1024;
inline constexpr size_t kOptInSharedBytes = 232448;  // 227 KiB

// cudaSuccess when the configuration is one the device launches.
inline cudaError_t CheckLaunchConfig(dim3 grid, dim3 block, size_t smem, int max_threads) {
  const unsigned long long threads =
      static_cast<unsigned long long>(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || block.z > kMaxBlockDimZ ||
      (max_threads > 0 && threads > static_cast<unsigned long long>(max_threads))) {
    return cudaErrorInvalidConfiguration;
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > kMaxGridDimX ||
      grid.y > kMaxGridDimYZ || grid.z > kMaxGridDimYZ) {
    return cudaErrorInvalidConfiguration;
  }
  if (smem > kOptInSharedBytes) return cudaErrorInvalidValue;
  return cudaSuccess;
}

#if defined(__CUDACC__)

// nvcc: the launch itself. Dynamic shared memory above 48 KiB needs the kernel's opt-in
// attribute, set here; the kernel's own launch bounds are read back from the device and must
// agree with LaunchBounds.
template <typename... Params, typename... Args>
cudaError_t Launch(const char* name, void (*kernel)(Params...), LaunchBounds bounds, dim3 grid,
                   dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  (void)name;
  cudaError_t err = CheckLaunchConfig(grid, block, smem, bounds.max_threads);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes attr;
  err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  const unsigned long long threads =
      static_cast<unsigned long long>(block.x) * block.y * block.z;
  if (threads > static_cast<unsigned long long>(attr.maxThreadsPerBlock)) {
    return cudaErrorInvalidConfiguration;
  }
  if (smem > kDefaultSharedBytes) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(std::forward<Args>(args))...);
  return cudaGetLastError();
}

#elif defined(SATDAR_CUDA_SIM)

// The simulator: each thread of the grid runs `kernel` as a fiber (kernel_sim.h).
template <typename... Params, typename... Args>
cudaError_t Launch(const char* name, void (*kernel)(Params...), LaunchBounds bounds, dim3 grid,
                   dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  const cudaError_t err = CheckLaunchConfig(grid, block, smem, bounds.max_threads);
  if (err != cudaSuccess) {
    ::satdar::cuda_sim::SetLastError(err);
    return cudaGetLastError();
  }
  return ::satdar::cuda_sim::LaunchKernel(name, kernel, grid, block, smem, stream,
                                          static_cast<Params>(std::forward<Args>(args))...);
}

#endif

#if defined(__CUDACC__) || defined(SATDAR_CUDA_SIM)
template <typename... Params, typename... Args>
cudaError_t Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t smem, cudaStream_t stream, Args&&... args) {
  return Launch(name, kernel, LaunchBounds{0}, grid, block, smem, stream,
                std::forward<Args>(args)...);
}
#endif

}  // namespace satdar::core::cuda

#if defined(__CUDACC__)
#define SATDAR_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#elif defined(SATDAR_CUDA_SIM)
#define SATDAR_DYNAMIC_SHARED(T, name) \
  T* name = static_cast<T*>(::satdar::cuda_sim::DynamicShared())
#endif

#endif  // SATDAR_CORE_CUDA_LAUNCH_H_
