// core/cuda/sim/include/cuda_bf16.h: CUDA's bfloat16 type for the CUDA simulator build, usable
// from .cu files (compiled by the host compiler) and plain .cc host code alike. Only what
// satdar uses: the 16-bit storage type and its conversions to and from float.
//
// Conversions are the device's: __float2bfloat16 / __float2bfloat16_rn round to nearest even,
// keep subnormals (no flush to zero: cvt.rn.bf16.f32 has no .ftz), keep +-inf, round values
// past the largest finite bf16 (0x7f7f) to inf, and turn every NaN into the canonical bf16 NaN
// 0x7fff, as CUDA's cuda_bf16.hpp documents (CUDART_NAN_BF16). Finite values and infinities
// agree bit for bit with core/dtype.h's FloatToBF16; NaNs differ in payload only (dtype.h
// keeps the payload and sign, the device does not), and stay NaN either way.
#ifndef SATDAR_CORE_CUDA_SIM_INCLUDE_CUDA_BF16_H_
#define SATDAR_CORE_CUDA_SIM_INCLUDE_CUDA_BF16_H_

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

struct __nv_bfloat16_raw {
  unsigned short x;
};

namespace satdar::cuda_sim::internal {

inline unsigned short FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN: the canonical bf16 NaN.
  // Round to nearest even on the 16 dropped bits. Inf stays inf (low bits are zero); the
  // largest finite values carry into the exponent and become inf, as on the device.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}

inline float Bf16BitsToFloat(unsigned short b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace satdar::cuda_sim::internal

// Trivially default-constructible (like CUDA's), so `__shared__ __nv_bfloat16 s[n];` needs no
// per-thread construction; converts implicitly from and to float, as CUDA's does by default.
struct __nv_bfloat16 {
  unsigned short __x;

  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(::satdar::cuda_sim::internal::FloatToBf16Bits(f)) {}
  operator float() const { return ::satdar::cuda_sim::internal::Bf16BitsToFloat(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
typedef __nv_bfloat16 nv_bfloat16;

static_assert(sizeof(__nv_bfloat16) == 2, "bf16 is 16-bit storage");

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16_raw{::satdar::cuda_sim::internal::FloatToBf16Bits(f)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) {
  return ::satdar::cuda_sim::internal::Bf16BitsToFloat(b.__x);
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }

#endif  // SATDAR_CORE_CUDA_SIM_INCLUDE_CUDA_BF16_H_
