// core/cuda/sim/prelude.h: force-included (`-x c++ -include core/cuda/sim/prelude.h`) into
// every .cu file the CUDA simulator build compiles with the host compiler. It supplies what
// nvcc supplies implicitly: the qualifiers, the built-in variables, barriers, warp
// collectives, atomics and the device math satdar's kernels call. Kernels compile unchanged;
// only launch sites go through core/cuda/launch.h.
#ifndef SATDAR_CORE_CUDA_SIM_PRELUDE_H_
#define SATDAR_CORE_CUDA_SIM_PRELUDE_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/cuda/sim/kernel_sim.h"

// nvcc's `#pragma unroll` is unknown to g++, and GCC 12 ignores `#pragma GCC diagnostic` for
// -Wunknown-pragmas, so the build compiles .cu files with -Wno-unknown-pragmas as well.

// Qualifiers. Every satdar .cu keeps its device functions in an anonymous namespace, so
// `__device__` needs no linkage change; `__forceinline__` keeps CUDA's meaning. No
// `__noinline__`: libstdc++ spells `__attribute__((__noinline__))` itself.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
// Block-shared storage: a host thread runs one block at a time to completion and all of the
// block's fibers run on that thread, so a thread_local static is exactly one copy per block
// in flight. Works in templates and __device__ helpers (one copy per instantiation).
#define __shared__ static thread_local

// Built-in variables, per fiber / per block, set by the scheduler (kernel_sim.cc). Values,
// not references: read-only as on the device, and GCC 12's UBSan miscompiles its null check
// on a member access through a reference to a TLS struct (it reported threadIdx.x == 255 as a
// null access).
namespace satdar::cuda_sim::internal {
inline uint3 ThreadIdxValue() { return g_thread_idx; }
inline uint3 BlockIdxValue() { return g_block_idx; }
inline dim3 BlockDimValue() { return g_block_dim; }
inline dim3 GridDimValue() { return g_grid_dim; }
}  // namespace satdar::cuda_sim::internal
#define threadIdx (::satdar::cuda_sim::internal::ThreadIdxValue())
#define blockIdx (::satdar::cuda_sim::internal::BlockIdxValue())
#define blockDim (::satdar::cuda_sim::internal::BlockDimValue())
#define gridDim (::satdar::cuda_sim::internal::GridDimValue())
// A variable, not a macro: cudaDeviceProp has a member of the same name.
constexpr int warpSize = 32;

// Barriers and warp collectives.
inline void __syncthreads() { ::satdar::cuda_sim::internal::SyncThreads(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::satdar::cuda_sim::internal::WarpCollective(::satdar::cuda_sim::internal::WarpOp::kSync, mask,
                                               0, 0, 32);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::satdar::cuda_sim::internal::WarpCollective(
      ::satdar::cuda_sim::internal::WarpOp::kBallot, mask, predicate != 0 ? 1u : 0u, 0, 32);
}

// No __activemask: lanes here run ahead to the next collective one at a time, so "the lanes
// converged right now" has no faithful answer (lanes that finished early would look exited).
// satdar does not call it; a new caller gets a compile error rather than a wrong mask.

// Any trivially copyable value of up to 8 bytes (int, unsigned, float, double, int64,
// __nv_bfloat16, ...); 8-byte values move as two 32-bit shuffles, as on the device.
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                "__shfl_xor_sync moves values of up to 8 bytes");
  uint32_t w[2] = {0, 0};
  std::memcpy(w, &var, sizeof(T));
  using ::satdar::cuda_sim::internal::WarpCollective;
  using ::satdar::cuda_sim::internal::WarpOp;
  w[0] = WarpCollective(WarpOp::kShflXor, mask, w[0], laneMask, width);
  if (sizeof(T) > 4) w[1] = WarpCollective(WarpOp::kShflXor, mask, w[1], laneMask, width);
  T out;
  std::memcpy(&out, w, sizeof(T));
  return out;
}

// Integer intrinsics.
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// Atomics: blocks run in parallel on host threads, so these are real atomic operations
// (fibers of one block never interleave inside one).
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <typename F>
inline F SatdarSimAtomicAddFloat(F* p, F v) {
  F old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  F sum;
  do {
    sum = old + v;
  } while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
inline float atomicAdd(float* p, float v) { return SatdarSimAtomicAddFloat(p, v); }
inline double atomicAdd(double* p, double v) { return SatdarSimAtomicAddFloat(p, v); }

// Unqualified min / max as CUDA's math headers provide them for device code: mixed argument
// types convert as the usual arithmetic conversions do (min(int64_t, int) is int64_t).
template <typename A, typename B,
          typename = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

// Device math beyond <cmath>'s expf, logf, sqrtf, tanhf, fmaxf, erff, INFINITY: the fast
// intrinsics are the accurate functions here (the device's are within a few ulp of them).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

#endif  // SATDAR_CORE_CUDA_SIM_PRELUDE_H_
