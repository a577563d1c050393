// core/dtype.h: the element types satdar stores and computes in.
#ifndef SATDAR_CORE_DTYPE_H_
#define SATDAR_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace satdar::core {

enum class DType { kF32, kF64, kBF16, kI32, kI64, kU16 };

size_t DTypeSize(DType dtype);
// Safetensors spelling: "F32", "F64", "BF16", "I32", "I64", "U16".
const char* DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(absl::string_view name);

// bfloat16 stored as its upper 16 bits; conversion rounds to nearest even.
struct BF16 {
  uint16_t bits;
};
inline BF16 FloatToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<uint16_t>((u >> 16) | 0x40)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return BF16{static_cast<uint16_t>(u >> 16)};
}
inline float BF16ToFloat(BF16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::kU16;
};
template <>
struct DTypeOf<BF16> {
  static constexpr DType value = DType::kBF16;
};

// Converts n elements between floating dtypes (f32, f64, bf16), e.g. for checkpoint I/O.
void ConvertFloats(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
bool IsFloating(DType dtype);

}  // namespace satdar::core

#endif  // SATDAR_CORE_DTYPE_H_
