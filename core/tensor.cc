#include "core/tensor.h"

#include "absl/strings/str_join.h"

namespace satdar::core {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, Shape shape, const Device& device) {
  size_t bytes = NumElements(shape) * DTypeSize(dtype);
  auto buffer = Buffer::Allocate(device, bytes);
  if (!buffer.ok()) return buffer.status();
  return Tensor(std::make_shared<Buffer>(std::move(buffer).value()), 0, dtype, std::move(shape));
}

Tensor::Tensor(std::shared_ptr<Buffer> storage, size_t offset, DType dtype, Shape shape)
    : storage_(std::move(storage)), offset_(offset), dtype_(dtype), shape_(std::move(shape)) {
  SATDAR_CHECK(offset_ + bytes() <= storage_->bytes()) << "view past the end of its buffer";
}

}  // namespace satdar::core
