#include "core/dtype.h"

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::core {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU16: return 2;
  }
  SATDAR_CHECK(false) << "bad dtype";
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU16: return "U16";
  }
  SATDAR_CHECK(false) << "bad dtype";
  return "";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64, DType::kU16}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

bool IsFloating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16;
}

namespace {
double LoadFloat(const void* src, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(src)[i];
    case DType::kF64: return static_cast<const double*>(src)[i];
    case DType::kBF16: return BF16ToFloat(static_cast<const BF16*>(src)[i]);
    default: SATDAR_CHECK(false) << "not a floating dtype: " << DTypeName(dtype);
  }
  return 0;
}
void StoreFloat(void* dst, DType dtype, size_t i, double value) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(dst)[i] = static_cast<float>(value); return;
    case DType::kF64: static_cast<double*>(dst)[i] = value; return;
    case DType::kBF16: static_cast<BF16*>(dst)[i] = FloatToBF16(static_cast<float>(value)); return;
    default: SATDAR_CHECK(false) << "not a floating dtype: " << DTypeName(dtype);
  }
}
}  // namespace

void ConvertFloats(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * DTypeSize(src_dtype));
    return;
  }
  for (size_t i = 0; i < n; ++i) StoreFloat(dst, dst_dtype, i, LoadFloat(src, src_dtype, i));
}

}  // namespace satdar::core
