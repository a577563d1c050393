#include "core/device.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"

namespace satdar::core {

std::string Device::ToString() const {
  return type == DeviceType::kCpu ? "cpu" : absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device{DeviceType::kCpu, 0};
  if (text == "cuda") return Device{DeviceType::kCuda, 0};
  if (absl::StartsWith(text, "cuda:")) {
    int index;
    if (absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
      return Device{DeviceType::kCuda, index};
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device: expected cpu, cuda or cuda:N, got '", text, "'"));
}

bool BuiltWithCuda() { return cuda::BuiltWithCuda(); }
bool BuiltWithSimulator() { return cuda::BuiltWithSimulator(); }

int CudaDeviceCount() { return cuda::DeviceCount(); }

absl::Status CheckDeviceAvailable(const Device& device) {
  if (device.type == DeviceType::kCpu) return absl::OkStatus();
  if (!BuiltWithCuda()) {
    return absl::InvalidArgumentError(
        "device cuda: this satdar was built without the CUDA toolkit (no nvcc was found at "
        "build time); rebuild on a machine with /usr/local/cuda");
  }
  int count = CudaDeviceCount();
  if (count == 0) {
    return absl::InvalidArgumentError(
        "device cuda: no CUDA GPU is visible on this machine (cudaGetDeviceCount found none)");
  }
  if (device.index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device.ToString(), ": only ",
                                                   count, " CUDA device(s) are visible"));
  }
  return absl::OkStatus();
}

}  // namespace satdar::core
