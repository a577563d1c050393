// core/tensor.h: a cheap handle on (part of) a Buffer with a dtype and a row-major shape.
// Kernels take raw typed pointers and sizes; Tensor carries them between modules (file I/O,
// parameter views) with their shape, so a mismatch is caught once at the boundary.
#ifndef SATDAR_CORE_TENSOR_H_
#define SATDAR_CORE_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"

namespace satdar::core {

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);  // "[4, 8]"

class Tensor {
 public:
  Tensor() = default;
  // A new zero-filled CPU tensor.
  static absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape, const Device& device = Device{});
  // A view of `storage` starting `offset` bytes in.
  Tensor(std::shared_ptr<Buffer> storage, size_t offset, DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return NumElements(shape_); }
  size_t bytes() const { return numel() * DTypeSize(dtype_); }
  const Device& device() const { return storage_->device(); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const {
    SATDAR_CHECK(DTypeOf<T>::value == dtype_)
        << "tensor holds " << DTypeName(dtype_) << ", read as " << DTypeName(DTypeOf<T>::value);
    return static_cast<T*>(raw());
  }

 private:
  std::shared_ptr<Buffer> storage_;
  size_t offset_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

}  // namespace satdar::core

#endif  // SATDAR_CORE_TENSOR_H_
