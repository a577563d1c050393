// CUDA AdamW: one thread per element, the same arithmetic as adamw_cpu.cc in fp32.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/ops/adamw.h"

namespace satdar::core::cuda {

namespace {
constexpr int kBlockSize = 256;

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            float lr, float b1, float b2, float c1, float c2, float eps, float wd,
                            float gs) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = grad[i] * gs;
  float mi = b1 * m[i] + (1.0f - b1) * g;
  float vi = b2 * v[i] + (1.0f - b2) * g * g;
  m[i] = mi;
  v[i] = vi;
  float mhat = mi / c1, vhat = vi / c2;
  param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
}
}  // namespace

absl::Status AdamWUpdate(const CudaExec& x, float* param, const float* grad, float* m, float* v,
                         int64_t n, const AdamWParams& p) {
  if (n == 0) return absl::OkStatus();
  const float c1 = static_cast<float>(1.0 - std::pow(p.beta1, static_cast<double>(p.step)));
  const float c2 = static_cast<float>(1.0 - std::pow(p.beta2, static_cast<double>(p.step)));
  int64_t blocks = (n + kBlockSize - 1) / kBlockSize;
  SATDAR_CUDA_RETURN_IF_ERROR(Launch(
      "AdamWKernel", AdamWKernel, dim3(static_cast<unsigned>(blocks)), dim3(kBlockSize), 0,
      x.stream, param, grad, m, v, n, static_cast<float>(p.lr), static_cast<float>(p.beta1),
      static_cast<float>(p.beta2), c1, c2, static_cast<float>(p.eps),
      static_cast<float>(p.weight_decay), static_cast<float>(p.grad_scale)));
  return absl::OkStatus();
}

}  // namespace satdar::core::cuda
