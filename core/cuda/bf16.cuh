// core/cuda/bf16.cuh: device-side load / store / convert helpers shared by the .cu kernels
// whose element type T is float or __nv_bfloat16. Arithmetic is fp32: bf16 values are widened
// on load and rounded to nearest even on store. Only for nvcc (device code); a .cu file pulls
// the names in with `using namespace ::satdar::core::cuda::device;` inside its own namespace.
#ifndef SATDAR_CORE_CUDA_BF16_CUH_
#define SATDAR_CORE_CUDA_BF16_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace satdar::core::cuda::device {

// Value conversions: ToF widens to fp32, FromF<T> rounds fp32 to T (nearest even for bf16).
__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ float FromF<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Pointer forms: Ld reads *p as fp32, St stores fp32 x at p (nearest even for bf16).
__device__ __forceinline__ float Ld(const float* p) { return *p; }
__device__ __forceinline__ float Ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void St(float* p, float x) { *p = x; }
__device__ __forceinline__ void St(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }

// Sum over the 32 lanes of a warp (xor butterfly, a fixed order); every lane gets the total.
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace satdar::core::cuda::device

#endif  // SATDAR_CORE_CUDA_BF16_CUH_
