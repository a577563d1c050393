// model/gpu/gpu_moe.h: the sparse MoE FFN of model/variants/moe.cc (MODELS.md section 6) on one
// GPU, for model/gpu/gpu_model.cc: fp32 router logits (bf16 or f32 GEMM operands, fp32
// output), softmax and top-k, a counting-sort dispatch plan in moe.cc's (expert, token) order,
// permute, per-expert cuBLASLt GEMMs (gate and up as one (2F, D) weight, SwiGLU, down),
// weighted combine, shared experts as dense SwiGLUs, the sequence-wise aux loss and z-loss
// added to the model's device loss; the backward of all of it with fp32 weight gradients.
//
// One host synchronisation per MoE layer and forward pass (two with recomputation, which runs
// the forward again): the per-expert row counts come back to the host, because each expert's
// GEMM is launched with its row count (Megatron's dropless grouped GEMM does the same).
// Expert parallelism is not on the GPU path (the trainer refuses --ep). CUDA builds only.
#ifndef SATDAR_MODEL_GPU_GPU_MOE_H_
#define SATDAR_MODEL_GPU_GPU_MOE_H_

#ifdef SATDAR_WITH_CUDA

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/workspace.h"
#include "core/exec.h"
#include "model/config.h"
#include "model/gpu/device_arena.h"

namespace satdar::core::cuda {
class CachingAllocator;
class GemmHandle;
}  // namespace satdar::core::cuda

namespace satdar::model::gpu {

template <typename T>  // float or __nv_bfloat16
class GpuMoe {
 public:
  // offset_of(name): where parameter `name` starts in the device buffers (weights, gradients);
  // workspace: the stream's scratch for the MoE ops (outlives this object).
  static absl::StatusOr<std::unique_ptr<GpuMoe>> Create(
      const ModelConfig& config, cudaStream_t stream, core::cuda::GemmHandle* gemm,
      core::cuda::CachingAllocator* alloc,
      const std::function<int64_t(const std::string&)>& offset_of,
      core::cuda::Workspace* workspace);
  ~GpuMoe();

  // Buffers for (B, T); with `shared_sets` every layer uses one set of saved activations (the
  // trainer's recomputation runs Forward again right before Backward).
  absl::Status Resize(int b, int t, bool shared_sets);
  int64_t activation_bytes() const { return arena_.bytes(); }

  // out (N, D) = MoE_i(z). With loss_acc (device fp64) non-null, adds scale * (aux + z-loss).
  absl::Status Forward(int layer, const T* w, const T* z, T* out, double* loss_acc, double scale);
  // dz (N, D) = d/dz <dout, MoE_i(z)> + the aux and z losses' path (times loss_scale), written;
  // grads (fp32) += every parameter gradient of the layer. Uses what the last Forward of
  // `layer` saved.
  absl::Status Backward(int layer, const T* w, float* grads, const T* z, const T* dout, T* dz,
                        double loss_scale);

 private:
  struct LayerOffsets {
    int64_t router = -1;
    std::vector<int64_t> experts, shared;  // each expert's gate_proj; up and down follow
  };
  struct Saved {  // one layer's forward state
    float *probs = nullptr, *lse = nullptr, *weight = nullptr, *fraction = nullptr;
    int *sel = nullptr, *counts = nullptr, *slots = nullptr, *row_of_slot = nullptr;
    T *xp = nullptr, *gate_up = nullptr, *act = nullptr, *y = nullptr;
    std::vector<T*> shared_gate_up, shared_act;
    std::vector<int> host_counts;  // rows per expert, on the host
  };

  // Each routed expert's weight `part` (0: gate and up, 2: down) in w.
  std::vector<const void*> ExpertWeights(const LayerOffsets& o, const T* w, int part) const;

  GpuMoe(const ModelConfig& c, cudaStream_t stream, core::cuda::GemmHandle* gemm,
         core::cuda::CachingAllocator* alloc, core::cuda::Workspace* workspace);

  const ModelConfig c_;
  const int d_, e_, k_, f_, shared_;
  const bool norm_topk_;
  cudaStream_t stream_;
  core::cuda::GemmHandle* gemm_;
  core::CudaExec exec_;  // stream_, gemm_ and the decoder's workspace (MoeRouterLoss's scratch)
  std::vector<LayerOffsets> off_;
  std::vector<Saved> saved_;
  int b_ = 0, t_ = 0;
  DeviceArena arena_;
  int* pinned_counts_ = nullptr;
  // Scratch shared by all layers.
  float *logits_ = nullptr, *dweight_ = nullptr;
  T *dlogits_ = nullptr, *shared_out_ = nullptr, *dy_ = nullptr, *dact_ = nullptr,
    *dgate_up_ = nullptr, *dxp_ = nullptr, *dsact_ = nullptr, *dsgate_up_ = nullptr;
};

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_GPU_GPU_MOE_H_
