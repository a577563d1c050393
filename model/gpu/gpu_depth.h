// model/gpu/gpu_depth.h: the depth-retrieval residuals, DAR (model/variants/dar.cc; two
// streams, every dar_variant, full and block) and AttnRes (model/variants/attnres.cc; one
// stream), for model/gpu/gpu_model.cc, over the cuda:: ops of model/variants/depth_retrieval_ops.h
// and model/gpu/train_kernels.h. Each sublayer retrieves its input from the history of block
// states (softmax over RMSNorm keys with a learned query), runs the decoder's branch (a
// callback), and writes the result into the partial block state; the final retrieval is
// x_final. DAR's scalars (mix, transport, write gates) are read from the fp32 master weights.
// CUDA builds only.
#ifndef SATDAR_MODEL_GPU_GPU_DEPTH_H_
#define SATDAR_MODEL_GPU_GPU_DEPTH_H_

#ifdef SATDAR_WITH_CUDA

#include <cuda_runtime.h>

#include <array>
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
class GpuDepthResidual {
 public:
  using BranchForward = GpuBranchForward<T>;
  using BranchBackward = GpuBranchBackward<T>;

  // config.residual "dar" or "attnres"; offset_of(name): where parameter `name` starts in the
  // device buffers.
  // workspace: the stream's scratch for the DAR and depth retrieval ops (outlives this object).
  GpuDepthResidual(const ModelConfig& config, cudaStream_t stream,
                   core::cuda::CachingAllocator* alloc,
                   const std::function<int64_t(const std::string&)>& offset_of,
                   core::cuda::Workspace* workspace);
  ~GpuDepthResidual();

  // h0: the embedding (B, T, C), the first entry of every history; x_final: the final
  // retrieval's output. Both are the decoder's and stay in place until the next Resize.
  absl::Status Resize(int b, int t, const T* h0, T* x_final);
  int64_t activation_bytes() const { return arena_.bytes(); }

  // w: compute weights, master: fp32 master weights (device buffers).
  absl::Status Forward(const T* w, const float* master, const BranchForward& branch);
  // From d loss / d x_final; grads (fp32) +=; *dh0 = d loss / d h0 (valid until the next call).
  absl::Status Backward(const T* w, const float* master, float* grads, const T* dx_final,
                        const BranchBackward& branch, const T** dh0);

 private:
  struct DarOffsets {
    int64_t query = -1, norm = -1, mix = -1, transport = -1, write = -1;
  };
  struct DarStep {
    T *u = nullptr, *y = nullptr, *r[2] = {nullptr, nullptr}, *partial[2] = {nullptr, nullptr};
    float* alpha[2] = {nullptr, nullptr};
  };

  const T* W(int64_t off) const { return w_ + off; }
  // ---- DAR (model/variants/dar.cc). Step l (1..2L+1; the last one reads out x_final) has
  // m(l) = 1 + (l-1)/block completed entries per stream and a partial sum when
  // (l-1) % block != 0; the write of sublayer l goes to steps_[l].partial.
  int Entries(int l) const { return 1 + (l - 1) / block_; }
  bool HasPartial(int l) const { return (l - 1) % block_ != 0; }
  int Sources(int l) const { return Entries(l) + (HasPartial(l) ? 1 : 0); }
  int MaxSources() const { return sublayers_ / block_ + 2; }
  // Device pointer lists of step l, stream s: keys, values, dkeys, dvalues (MaxSources each).
  T* const* PtrList(int l, int s, int which) const {
    return dar_ptrs_ + ((static_cast<size_t>(l - 1) * 2 + s) * 4 + which) * MaxSources();
  }

  absl::Status ResizeSteps(size_t n);
  absl::Status RunForward();
  absl::Status DarRetrievalBackward(int l, const T* du);
  absl::Status RunBackward(const T* dx_final, const T** dh0);

  const bool dar_, attnres_;
  const int streams_;  // DAR's two streams, AttnRes's one
  const int sublayers_, block_, d_;
  const float eps_;
  cudaStream_t stream_;
  core::CudaExec exec_;  // stream_ and the decoder's workspace
  DeviceArena arena_;
  std::vector<DarOffsets> dar_off_;
  std::array<std::array<int, 2>, 2> route_{};  // per stream: {key stream, value stream}
  int rows_ = 0;
  const T* h0_ = nullptr;
  T* x_final_ = nullptr;
  // The current call's weights, gradients and branches.
  const T* w_ = nullptr;
  const float* master_ = nullptr;
  float* g_ = nullptr;
  const BranchForward* fwd_ = nullptr;
  const BranchBackward* bwd_ = nullptr;
  std::vector<DarStep> steps_;
  std::vector<T*> dsources_[2];
  T *dpartial_[2] = {nullptr, nullptr}, *dr_[2] = {nullptr, nullptr};
  T *du_ = nullptr, *dy_ = nullptr, *dh0_buf_ = nullptr;
  T** dar_ptrs_ = nullptr;
};

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_GPU_GPU_DEPTH_H_
