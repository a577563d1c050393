// Transparent Attention's depth softmax on the GPU (transparent_ops.h;
// transparent_ops_cpu.cc is the reference): one thread, the sums in double in source order.
#include "core/check.h"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "model/variants/transparent_ops.h"

namespace satdar::model::cuda {

namespace {

using ::satdar::core::cuda::Launch;

__global__ void DepthSoftmaxForwardKernel(float* a, const float* z, int count) {
  if (threadIdx.x != 0 || count <= 0) return;
  float top = z[0];
  for (int i = 1; i < count; ++i) top = fmaxf(top, z[i]);
  double sum = 0.0;
  for (int i = 0; i < count; ++i) sum += exp(static_cast<double>(z[i]) - top);
  for (int i = 0; i < count; ++i) {
    a[i] = static_cast<float>(exp(static_cast<double>(z[i]) - top) / sum);
  }
}

__global__ void DepthSoftmaxBackwardKernel(float* grad_z, const float* a, const float* grad_a,
                                           int count) {
  if (threadIdx.x != 0) return;
  double dot = 0.0;
  for (int i = 0; i < count; ++i) dot += static_cast<double>(a[i]) * grad_a[i];
  for (int i = 0; i < count; ++i) {
    grad_z[i] += static_cast<float>(static_cast<double>(a[i]) * (grad_a[i] - dot));
  }
}

}  // namespace

absl::Status DepthSoftmaxForward(const core::CudaExec& x, float* a, const float* z, int count) {
  if (count <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthSoftmaxForwardKernel", DepthSoftmaxForwardKernel,
                                     dim3(1), dim3(32), 0, x.stream, a, z, count));
  return absl::OkStatus();
}

absl::Status DepthSoftmaxBackward(const core::CudaExec& x, float* grad_z, const float* a,
                                  const float* grad_a, int count) {
  if (count <= 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("DepthSoftmaxBackwardKernel", DepthSoftmaxBackwardKernel,
                                     dim3(1), dim3(32), 0, x.stream, grad_z, a, grad_a, count));
  return absl::OkStatus();
}

}  // namespace satdar::model::cuda
