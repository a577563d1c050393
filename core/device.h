// core/device.h: where memory lives and kernels run.
#ifndef SATDAR_CORE_DEVICE_H_
#define SATDAR_CORE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace satdar::core {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  std::string ToString() const;
};

// Parses "cpu", "cuda" or "cuda:N".
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// Number of usable CUDA devices: 0 when the build has no CUDA or the machine has no GPU.
int CudaDeviceCount();
bool BuiltWithCuda();
// The CUDA simulator build (core/cuda/sim): --device cuda runs on a simulated device.
bool BuiltWithSimulator();

// Checks that `device` can be used here; the error says why not (no CUDA build, no GPU).
absl::Status CheckDeviceAvailable(const Device& device);

}  // namespace satdar::core

#endif  // SATDAR_CORE_DEVICE_H_
