// model/gpu/gpu_denseformer.h: DenseFormer's topology (model/variants/denseformer.cc) for
// model/gpu/gpu_model.cc. Layer i maps its input h[2i] through the attention branch to h[2i+1]
// and the MLP branch to X_{i+1}; its depth-weighted average of X_0 = h0 .. X_{i+1} (weights
// model.layers.{i}.dwa.weight, read from the fp32 master weights) is the next layer's input
// h[2i+2] (the last one: x_final). The branches are the decoder's, passed as callbacks.
// CUDA builds only.
#ifndef SATDAR_MODEL_GPU_GPU_DENSEFORMER_H_
#define SATDAR_MODEL_GPU_GPU_DENSEFORMER_H_

#ifdef SATDAR_WITH_CUDA

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/cuda/workspace.h"
#include "core/exec.h"
#include "model/config.h"
#include "model/gpu/device_arena.h"
#include "model/gpu/gpu_branches.h"

namespace satdar::core::cuda {
class CachingAllocator;
}  // namespace satdar::core::cuda

namespace satdar::model::gpu {

template <typename T>  // float or __nv_bfloat16
class GpuDenseFormer {
 public:
  using BranchForward = GpuBranchForward<T>;
  using BranchBackward = GpuBranchBackward<T>;

  // offset_of(name): where parameter `name` starts in the device buffers.
  // workspace: the stream's scratch for the DWA ops (outlives this object).
  GpuDenseFormer(const ModelConfig& config, cudaStream_t stream,
                 core::cuda::CachingAllocator* alloc,
                 const std::function<int64_t(const std::string&)>& offset_of,
                 core::cuda::Workspace* workspace);
  ~GpuDenseFormer();

  // h: the decoder's 2L+1 states for (B, T) (h[0] = the embedding, h[2L] = x_final); y: an
  // (N, D) scratch buffer.
  absl::Status Resize(int b, int t, const std::vector<T*>& h, T* y);
  int64_t activation_bytes() const { return arena_.bytes(); }

  absl::Status Forward(const float* master, const BranchForward& branch);
  // From d loss / d x_final; *dh0 = d loss / d h0 (valid until the next call).
  absl::Status Backward(const float* master, float* grads, const T* dx_final,
                        const BranchBackward& branch, const T** dh0);

 private:

  const int layers_, d_;
  cudaStream_t stream_;
  core::CudaExec exec_;  // stream_ and the decoder's workspace
  std::vector<int64_t> dwa_off_;
  DeviceArena arena_;
  int64_t nc_ = 0;
  std::vector<T*> h_, x_, dx_;  // the decoder's states; the sources X_0..X_L; their gradients
  T* y_ = nullptr;
  T** ptrs_ = nullptr;  // device: x_ then dx_
  T *dmid_ = nullptr, *dh0_ = nullptr;
};

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_GPU_GPU_DENSEFORMER_H_
