// core/buffer.h: an owning block of memory on one device, freed by that device's deleter.
//
//   SATDAR_ASSIGN_OR_RETURN(Buffer params, Buffer::Allocate(Device{}, table.bytes()));
//   float* p = params.data<float>();
//
// CPU buffers are 64-byte aligned and zero-filled. Buffers move, never copy.
#ifndef SATDAR_CORE_BUFFER_H_
#define SATDAR_CORE_BUFFER_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace satdar::core {

// Frees memory of the device it was allocated on.
struct BufferDeleter {
  DeviceType type;
  void operator()(void* p) const;
};

class Buffer {
 public:
  Buffer() = default;
  static absl::StatusOr<Buffer> Allocate(const Device& device, size_t bytes);

  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_.get(); }
  template <typename T>
  T* data() const {
    return static_cast<T*>(ptr_.get());
  }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

 private:
  std::unique_ptr<void, BufferDeleter> ptr_{nullptr, BufferDeleter{DeviceType::kCpu}};
  size_t bytes_ = 0;
  Device device_;
};

}  // namespace satdar::core

#endif  // SATDAR_CORE_BUFFER_H_
