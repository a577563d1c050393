// core/ops/swiglu.h: act = silu(gate) * up over rows that hold [gate | up] side by side
// (the output of one fused GEMM with the gate and up weights stacked).
#ifndef SATDAR_CORE_OPS_SWIGLU_H_
#define SATDAR_CORE_OPS_SWIGLU_H_

#include <cstdint>

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// out (N,F); gate_up (N,2F): gate = columns [0,F), up = [F,2F).
template <typename T>
void SwigluForward(T* out, const T* gate_up, int n, int f, ThreadPool* pool);

// dgate_up (N,2F) overwritten (not accumulated); dout (N,F).
template <typename T>
void SwigluBackward(T* dgate_up, const T* dout, const T* gate_up, int n, int f, ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_SWIGLU_H_
