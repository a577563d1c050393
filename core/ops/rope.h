// core/ops/rope.h: rotary position embedding, Hugging Face Llama convention (half split).
//   inv_freq_i = theta^(-2i/HS), angle(t,i) = t * inv_freq_i, x = [x1, x2] halves,
//   rope(x) = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1].
#ifndef SATDAR_CORE_OPS_ROPE_H_
#define SATDAR_CORE_OPS_ROPE_H_

#include <vector>

#include "core/thread_pool.h"

namespace satdar::core::cpu {

// cos, sin tables (T, HS/2) for positions 0..T-1, computed in double.
template <typename T>
void RopeTables(std::vector<T>* cos, std::vector<T>* sin, int seq_len, int head_size,
                double theta);

// x (B,T,NH,HS) rotated in place.
template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int b, int t, int nh, int hs, ThreadPool* pool);

// dx (B,T,NH,HS): the gradient of the rotation, applied in place (the transpose rotation).
template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int b, int t, int nh, int hs,
                  ThreadPool* pool);

}  // namespace satdar::core::cpu

#endif  // SATDAR_CORE_OPS_ROPE_H_
