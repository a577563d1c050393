#include "core/buffer.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"

namespace satdar::core {

void BufferDeleter::operator()(void* p) const {
  if (p == nullptr) return;
  if (type == DeviceType::kCpu) {
    std::free(p);
  } else {
    cuda::Free(p);
  }
}

absl::StatusOr<Buffer> Buffer::Allocate(const Device& device, size_t bytes) {
  Buffer buffer;
  buffer.bytes_ = bytes;
  buffer.device_ = device;
  if (bytes == 0) return buffer;
  void* p = nullptr;
  if (device.type == DeviceType::kCpu) {
    size_t rounded = (bytes + 63) / 64 * 64;
    p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    std::memset(p, 0, rounded);
  } else {
    auto result = cuda::Malloc(bytes, device.index);
    if (!result.ok()) return result.status();
    p = *result;
  }
  buffer.ptr_ = std::unique_ptr<void, BufferDeleter>(p, BufferDeleter{device.type});
  return buffer;
}

}  // namespace satdar::core
