// core/ops/swiglu.h: act = silu(gate) * up, elementwise over N values.
#ifndef SATDAR_CORE_OPS_SWIGLU_H_
#define SATDAR_CORE_OPS_SWIGLU_H_

#include <cstdint>

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// out, gate, up: (N) (for the MLP, N = B*T*F).
template <typename T>
void SwigluForward(T* out, const T* gate, const T* up, int64_t n, ThreadPool* pool);

// dgate, dup: (N), overwritten (not accumulated).
template <typename T>
void SwigluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n,
                    ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_SWIGLU_H_
