// core/cuda/sim/kernel_sim.h: kernel execution for the CUDA simulator build.
//
// A launch queues one job on its stream (runtime_sim.cc's Enqueue). The job runs the grid's
// blocks in parallel on a process-wide pool of host threads (SATDAR_SIM_THREADS, default
// std::thread::hardware_concurrency(); the stream's own thread works on the grid too), one
// block at a time per host thread, to completion. Inside a block every CUDA thread is a fiber
// with its own stack; fibers switch only at __syncthreads, warp collectives and exit, so a
// block is a deterministic cooperative program whose interleaving is the fiber order:
//
//   SATDAR_SIM_ORDER=forward (default) | reverse | shuffle:SEED, or SetFiberOrder() in tests.
//
// A kernel that lacks a barrier it needs usually computes different results under forward and
// reverse order. A barrier some threads of the block never reach, or warp collectives that do
// not match, are reported (Report) naming the kernel and block, and the launch's stream gets
// cudaErrorLaunchFailure, as a device fault would; nothing hangs.
//
// Each fiber stack is SATDAR_SIM_STACK_KB KiB (default 64, 256 under ASan) with a guard page
// below it; an overflow faults there and is reported with the kernel's name before the process
// dies.
//
// Kernels use this header only through core/cuda/launch.h and prelude.h.
#ifndef SATDAR_CORE_CUDA_SIM_KERNEL_SIM_H_
#define SATDAR_CORE_CUDA_SIM_KERNEL_SIM_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>

#include "core/cuda/sim/sim_runtime.h"

namespace satdar::cuda_sim {

enum class FiberOrder { kForward, kReverse, kShuffle };

// Sets the order in which runnable fibers of a block run (for launches made after the call).
// kShuffle draws a new permutation per block and per barrier phase from `seed` and the block
// index, so a run is reproducible whatever the host threads do.
void SetFiberOrder(FiberOrder order, uint64_t seed = 0);

// The calling block's dynamic shared memory: exactly the launch's `smem` bytes, fresh for
// each block (filled with 0xff bytes, a NaN as float, so a read before a write shows), so
// AddressSanitizer sees an overrun. nullptr when the launch asked for none.
void* DynamicShared();

namespace internal {

template <typename T>
struct NonDeduced {
  using type = T;
};

// Queues `body` (one CUDA thread's work) to run grid x block times on `stream`.
cudaError_t LaunchGrid(const char* name, dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, std::function<void()> body);

}  // namespace internal

// Launches `kernel` with parameters already converted to its parameter types (launch.h does
// that); they are copied once at launch and every CUDA thread gets its own copy, as on the
// device. Returns cudaGetLastError() after recording a launch failure (a bad stream).
template <typename... Params>
cudaError_t LaunchKernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                         size_t smem, cudaStream_t stream,
                         typename internal::NonDeduced<Params>::type... args) {
  return internal::LaunchGrid(
      name, grid, block, smem, stream,
      [kernel, params = std::tuple<Params...>(std::move(args)...)]() {
        std::apply(kernel, params);
      });
}

// Device-side entry points behind prelude.h's intrinsics.
namespace internal {

// Per host thread, set by the scheduler at each switch (so `threadIdx.x` is a plain TLS load;
// initial-exec because satdar never dlopens the simulator).
#define SATDAR_SIM_TLS __thread __attribute__((tls_model("initial-exec")))
extern SATDAR_SIM_TLS uint3 g_thread_idx;
extern SATDAR_SIM_TLS uint3 g_block_idx;
extern SATDAR_SIM_TLS dim3 g_block_dim;
extern SATDAR_SIM_TLS dim3 g_grid_dim;
#undef SATDAR_SIM_TLS

enum class WarpOp : uint8_t { kSync, kShflXor, kBallot };

void SyncThreads();
// One warp collective over the lanes in `mask`; `value` is this lane's 32-bit operand. For
// kShflXor returns the value from lane ^ lane_mask (CUDA's width rule), for kBallot the mask
// of lanes whose value is nonzero, for kSync 0.
uint32_t WarpCollective(WarpOp op, unsigned mask, uint32_t value, int lane_mask, int width);

}  // namespace internal
}  // namespace satdar::cuda_sim

#endif  // SATDAR_CORE_CUDA_SIM_KERNEL_SIM_H_
