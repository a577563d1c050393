// The GPU model's small kernels (train_kernels.h). Reductions: a fixed grid of kReduceBlocks
// blocks, each thread a fixed grid-stride slice, a shared-memory tree per block, then one
// thread per quantity adds the block sums in block order.
#include "model/gpu/train_kernels.h"

#include "core/cuda/bf16.cuh"
#include "core/cuda/reduce.cuh"

namespace satdar::model::gpu {

namespace {

using namespace ::satdar::core::cuda::device;  // NOLINT: ToF, Ld, St, GridBlocks, BlockSums

constexpr int kThreads = 256;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

template <typename T>
__global__ void CastKernel(T* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(out + i, in[i]);
  }
}

template <typename T>
__global__ void AddKernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(out + i, Ld(a + i) + Ld(b + i));
  }
}

// ResFormer's lambdas for layer p.layer (>= 1), from the fp32 master weights.
__device__ void ResformerLambdas(const ResformerParams& p, float* l1, float* l2) {
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
__global__ void ResformerForwardKernel(T* vmix, const T* v1, const T* v, ResformerParams p,
                                       int64_t n) {
  float l1, l2;
  ResformerLambdas(p, &l1, &l2);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    St(vmix + i, l1 * Ld(v1 + i) + l2 * Ld(v + i));
  }
}

template <typename T>
__global__ void ResformerBackwardKernel(T* dv, T* dv1, const T* dvmix, const T* v1, const T* v,
                                        ResformerParams p, float* scratch, int64_t n) {
  float l1, l2;
  ResformerLambdas(p, &l1, &l2);
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
__global__ void ResformerFinishKernel(const float* scratch, ResformerParams p, float* grad_scale,
                                      float* grad_logits, float* grad_lambda2) {
  if (threadIdx.x != 0) return;
  double dl1 = 0.0, dl2 = 0.0;
  for (int b = 0; b < kReduceBlocks; ++b) {
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

template <typename T>
__global__ void DwaForwardKernel(T* out, const T* const* xs, int count, const float* a,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < count; ++j) acc += a[j] * Ld(xs[j] + i);
    St(out + i, acc);
  }
}

// Block (b, j): dxs[j] += a_j dy over its slice; its share of <xs[j], dy> to scratch.
template <typename T>
__global__ void DwaBackwardKernel(T* const* dxs, const T* dy, const T* const* xs, const float* a,
                                  float* scratch, int64_t n) {
  const int j = blockIdx.y;
  const float aj = a[j];
  const T* x = xs[j];
  T* dx = dxs[j];
  float acc[1] = {0.0f};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = Ld(dy + i);
    acc[0] += Ld(x + i) * g;
    St(dx + i, Ld(dx + i) + aj * g);
  }
  BlockSums<kThreads, 1>(acc);
  if (threadIdx.x == 0) scratch[static_cast<int64_t>(j) * kReduceBlocks + blockIdx.x] = acc[0];
}

__global__ void DwaFinishKernel(const float* scratch, int count, float* grad_a) {
  const int j = threadIdx.x;
  if (j >= count) return;
  double s = 0.0;
  for (int b = 0; b < kReduceBlocks; ++b) s += scratch[static_cast<int64_t>(j) * kReduceBlocks + b];
  grad_a[j] += static_cast<float>(s);
}

__global__ void LossKernel(double* acc, const float* losses, int n, double scale) {
  double v[1] = {0.0};
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[0] += losses[i];
  BlockSums<kThreads, 1>(v);
  if (threadIdx.x == 0) *acc += scale * v[0];
}

__global__ void SumSquaresKernel(double* scratch, const float* x, int64_t n) {
  double v[1] = {0.0};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double e = x[i];
    v[0] += e * e;
  }
  BlockSums<kThreads, 1>(v);
  if (threadIdx.x == 0) scratch[blockIdx.x] = v[0];
}

__global__ void SumFinishKernel(double* out, const double* scratch) {
  if (threadIdx.x != 0) return;
  double s = 0.0;
  for (int b = 0; b < kReduceBlocks; ++b) s += scratch[b];
  *out = s;
}

}  // namespace

template <typename T>
cudaError_t CastFromF32(T* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastKernel<T><<<Blocks(n), kThreads, 0, stream>>>(out, in, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Add(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<T><<<Blocks(n), kThreads, 0, stream>>>(out, a, b, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ResformerMixForward(T* vmix, const T* v1, const T* v, const ResformerParams& p,
                                int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ResformerForwardKernel<T><<<Blocks(n), kThreads, 0, stream>>>(vmix, v1, v, p, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ResformerMixBackward(T* dv, T* dv1, const T* dvmix, const T* v1, const T* v,
                                 const ResformerParams& p, float* grad_scale, float* grad_logits,
                                 float* grad_lambda2, float* scratch, int64_t n,
                                 cudaStream_t stream) {
  ResformerBackwardKernel<T><<<kReduceBlocks, kThreads, 0, stream>>>(dv, dv1, dvmix, v1, v, p,
                                                                     scratch, n);
  if (p.scale != nullptr) {
    ResformerFinishKernel<<<1, 32, 0, stream>>>(scratch, p, grad_scale, grad_logits,
                                                grad_lambda2);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t DwaForward(T* out, const T* const* xs, int count, const float* a, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DwaForwardKernel<T><<<Blocks(n), kThreads, 0, stream>>>(out, xs, count, a, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t DwaBackward(T* const* dxs, float* grad_a, const T* dy, const T* const* xs, int count,
                        const float* a, float* scratch, int64_t n, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  DwaBackwardKernel<T><<<dim3(kReduceBlocks, count), kThreads, 0, stream>>>(dxs, dy, xs, a,
                                                                            scratch, n);
  DwaFinishKernel<<<1, ((count + 31) / 32) * 32, 0, stream>>>(scratch, count, grad_a);
  return cudaGetLastError();
}

cudaError_t AccumulateLoss(double* acc, const float* losses, int n, double scale,
                           cudaStream_t stream) {
  LossKernel<<<1, kThreads, 0, stream>>>(acc, losses, n, scale);
  return cudaGetLastError();
}

cudaError_t SumSquares(double* out, const float* x, int64_t n, double* scratch,
                       cudaStream_t stream) {
  SumSquaresKernel<<<kReduceBlocks, kThreads, 0, stream>>>(scratch, x, n);
  SumFinishKernel<<<1, 32, 0, stream>>>(out, scratch);
  return cudaGetLastError();
}

#define SATDAR_INSTANTIATE(T)                                                                  \
  template cudaError_t CastFromF32<T>(T*, const float*, int64_t, cudaStream_t);                \
  template cudaError_t Add<T>(T*, const T*, const T*, int64_t, cudaStream_t);                  \
  template cudaError_t ResformerMixForward<T>(T*, const T*, const T*, const ResformerParams&,  \
                                              int64_t, cudaStream_t);                          \
  template cudaError_t ResformerMixBackward<T>(T*, T*, const T*, const T*, const T*,           \
                                               const ResformerParams&, float*, float*, float*, \
                                               float*, int64_t, cudaStream_t);                  \
  template cudaError_t DwaForward<T>(T*, const T* const*, int, const float*, int64_t,          \
                                     cudaStream_t);                                            \
  template cudaError_t DwaBackward<T>(T* const*, float*, const T*, const T* const*, int,       \
                                      const float*, float*, int64_t, cudaStream_t);
SATDAR_INSTANTIATE(float)
SATDAR_INSTANTIATE(__nv_bfloat16)
#undef SATDAR_INSTANTIATE

}  // namespace satdar::model::gpu
