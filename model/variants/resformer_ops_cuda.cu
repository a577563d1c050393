// ResFormer's value mix on the GPU (resformer_ops.h; resformer_ops_cpu.cc is the reference).
// Reductions: the grid of core::cuda::ReduceBlocks(n) blocks, then one thread adds the block
// sums in block order.
#include "core/cuda/bf16.cuh"
#include "core/check.h"
#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/reduce_grid.h"
#include "model/variants/resformer_ops.h"
#include "core/cuda/workspace.h"

namespace satdar::model::cuda {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: ToF, Ld, St, GridBlocks, BlockSums
using ::satdar::core::cuda::Launch;

constexpr int kThreads = 256;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

// ResFormer's lambdas for layer p.layer (>= 1), from the fp32 master weights.
__device__ void Lambdas(const ResformerLambdas<float>& p, float* l1, float* l2) {
  if (p.scale == nullptr) {
    *l1 = *l2 = 0.5f;
    return;
  }
  float mx = p.logits[0];
  for (int k = 1; k < p.layers - 1; ++k) mx = fmaxf(mx, p.logits[k]);
  float sum = 0.0f;
  for (int k = 0; k < p.layers - 1; ++k) sum += expf(p.logits[k] - mx);
  *l1 = p.scale[0] * expf(p.logits[p.layer - 1] - mx) / sum;
  *l2 = p.lambda2[0];
}

template <typename T>
__global__ void ResformerForwardKernel(T* vmix, const T* v1, const T* v, ResformerLambdas<float> p,
                                       int64_t n) {
  float l1, l2;
  Lambdas(p, &l1, &l2);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(vmix + i, l1 * Ld(v1 + i) + l2 * Ld(v + i));
  }
}

template <typename T>
__global__ void ResformerBackwardKernel(T* dv, T* dv1, const T* dvmix, const T* v1, const T* v,
                                        ResformerLambdas<float> p, float* scratch, int64_t n) {
  float l1, l2;
  Lambdas(p, &l1, &l2);
  float acc[2] = {0.0f, 0.0f};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = Ld(dvmix + i);
    acc[0] += Ld(v1 + i) * g;
    acc[1] += Ld(v + i) * g;
    St(dv + i, l2 * g);
    St(dv1 + i, Ld(dv1 + i) + l1 * g);
  }
  BlockSums<kThreads, 2>(acc);
  if (threadIdx.x == 0) {
    scratch[blockIdx.x * 2] = acc[0];
    scratch[blockIdx.x * 2 + 1] = acc[1];
  }
}

// l1 = s softmax(q)[j], j = layer - 1: ds += dl1 p_j; dq_k += s dl1 p_j (delta_jk - p_k);
// dlambda2 += dl2 (resformer.cc).
__global__ void ResformerFinishKernel(const float* scratch, int blocks, ResformerLambdas<float> p,
                                      float* grad_scale, float* grad_logits, float* grad_lambda2) {
  if (threadIdx.x != 0) return;
  double dl1 = 0.0, dl2 = 0.0;
  for (int b = 0; b < blocks; ++b) {
    dl1 += scratch[b * 2];
    dl2 += scratch[b * 2 + 1];
  }
  grad_lambda2[0] += static_cast<float>(dl2);
  const int m = p.layers - 1, j = p.layer - 1;
  double mx = p.logits[0];
  for (int k = 1; k < m; ++k) mx = fmax(mx, static_cast<double>(p.logits[k]));
  double sum = 0.0;
  for (int k = 0; k < m; ++k) sum += exp(p.logits[k] - mx);
  const double pj = exp(p.logits[j] - mx) / sum, s = p.scale[0];
  grad_scale[0] += static_cast<float>(dl1 * pj);
  for (int k = 0; k < m; ++k) {
    const double pk = exp(p.logits[k] - mx) / sum;
    grad_logits[k] += static_cast<float>(s * dl1 * pj * ((k == j ? 1.0 : 0.0) - pk));
  }
}

}  // namespace

template <typename T>
absl::Status ResformerMixForward(const core::CudaExec& x, T* vmix, const T* v1, const T* v,
                                 const ResformerLambdas<float>& p, int64_t n) {
  cudaStream_t stream = x.stream;
  if (n == 0) return absl::OkStatus();
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ResformerForwardKernel", ResformerForwardKernel<T>,
                                     dim3(Blocks(n)), dim3(kThreads), 0, stream, vmix, v1, v, p,
                                     n));
  return absl::OkStatus();
}

template <typename T>
absl::Status ResformerMixBackward(const core::CudaExec& x, T* dv, T* dv1, const T* dvmix,
                                  const T* v1, const T* v, const ResformerLambdas<float>& p,
                                  float* grad_scale, float* grad_logits, float* grad_lambda2,
                                  int64_t n) {
  cudaStream_t stream = x.stream;
  const int blocks = core::cuda::ReduceBlocks(n, kThreads);
  SATDAR_ASSIGN_OR_RETURN(float* scratch,
                          core::cuda::Scratch<float>(x, 2 * blocks, "ResformerMixBackward"));
  SATDAR_CUDA_RETURN_IF_ERROR(Launch("ResformerBackwardKernel", ResformerBackwardKernel<T>,
                                     dim3(blocks), dim3(kThreads), 0, stream, dv, dv1, dvmix, v1,
                                     v, p, scratch, n));
  if (p.scale != nullptr) {
    SATDAR_CUDA_RETURN_IF_ERROR(Launch("ResformerFinishKernel", ResformerFinishKernel, dim3(1),
                                       dim3(32), 0, stream, scratch, blocks, p, grad_scale,
                                       grad_logits, grad_lambda2));
  }
  return absl::OkStatus();
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template absl::Status ResformerMixForward<T>(const core::CudaExec&, T*, const T*, const T*,  \
                                               const ResformerLambdas<float>&, int64_t);       \
  template absl::Status ResformerMixBackward<T>(const core::CudaExec&, T*, T*, const T*,       \
                                                const T*, const T*,                            \
                                                const ResformerLambdas<float>&, float*, float*, \
                                                float*, int64_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::cuda
