// model/gpu/gpu_hyper.h: the n-stream residual topologies, Hyper-Connections
// (model/variants/hyper_connections.cc) and mHC (model/variants/mhc.cc), for
// model/gpu/gpu_model.cc, over the cuda:: side of model/variants/hyper_ops.h (the stream
// mixing, HC's and mHC's coefficients, the Sinkhorn). Each sublayer l reads
// u = sum_j pre_j H_j from the hyper state H (N, n, C), runs the decoder's branch y = f_l(u)
// (a callback), and writes H'_m = post_m y + sum_j res_jm H_j. Coefficient projections are
// cuBLASLt GEMMs with bf16 (or f32) operands and fp32 outputs; the scalars (static parts,
// scales, biases) are read from the fp32 master weights. Kept per sublayer: H, the
// coefficients and their inputs (the normalised HC rows and mHC's Sinkhorn iterates are
// recomputed in the backward). CUDA builds only.
#ifndef SATDAR_MODEL_GPU_GPU_HYPER_H_
#define SATDAR_MODEL_GPU_GPU_HYPER_H_

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
#include "model/gpu/gpu_branches.h"
#include "model/variants/hyper_ops.h"

namespace satdar::core::cuda {
class CachingAllocator;
class GemmHandle;
}  // namespace satdar::core::cuda

namespace satdar::model::gpu {

template <typename T>  // float or __nv_bfloat16
class GpuHyper {
 public:
  using BranchForward = GpuBranchForward<T>;
  using BranchBackward = GpuBranchBackward<T>;

  // config.residual "hc" or "mhc"; offset_of(name): where parameter `name` starts in the
  // device buffers; workspace: the stream's scratch for the HC/mHC ops (outlives this object).
  // Fails (InternalError) if a design's projection weights are not adjacent.
  static absl::StatusOr<std::unique_ptr<GpuHyper>> Create(
      const ModelConfig& config, cudaStream_t stream, core::cuda::GemmHandle* gemm,
      core::cuda::CachingAllocator* alloc,
      const std::function<int64_t(const std::string&)>& offset_of,
      core::cuda::Workspace* workspace);
  ~GpuHyper();

  absl::Status Resize(int b, int t);
  int64_t activation_bytes() const { return arena_.bytes(); }

  // w: the compute weights, master: the fp32 master weights (both in the device buffers).
  absl::Status Forward(const T* w, const float* master, const T* h0, T* x_final,
                       const BranchForward& branch);
  // grads (fp32) +=; *dh0 = d loss / d h0 (valid until the next call).
  absl::Status Backward(const T* w, const float* master, float* grads, const T* dx_final,
                        const BranchBackward& branch, const T** dh0);

 private:
  struct Offsets {
    // HC: norm.weight, static_alpha, static_beta, dynamic_alpha (+ dynamic_beta right after),
    // alpha_scale, beta_scale. mHC: fn, scale, base.
    int64_t norm = -1, static_alpha = -1, static_beta = -1, dynamic = -1, alpha_scale = -1,
            beta_scale = -1, fn = -1, scale = -1, base = -1;
  };
  struct Step {
    T *h = nullptr, *u = nullptr, *y = nullptr;  // H before the sublayer, its branch in/out
    float* rstd = nullptr;   // HC: (N*n) of RMSNorm(H_j)
    float* proj = nullptr;   // HC: (N*n, ld) tanh of the projections; mHC: (N, ld) raw
    float* coef = nullptr;   // HC: (N, n(n+2)); mHC: (N, 2n) pre, post
    float* rms = nullptr;    // mHC: (N)
    float* logits = nullptr;  // mHC: (N, n, n) Sinkhorn input
  };

  GpuHyper(const ModelConfig& config, cudaStream_t stream, core::cuda::GemmHandle* gemm,
           core::cuda::CachingAllocator* alloc, core::cuda::Workspace* workspace);
  absl::Status Coefficients(const T* w, const float* master, int l);
  // dh (+=) gets the coefficients' path to H.
  absl::Status CoefficientsBackward(const T* w, const float* master, float* grads, int l,
                                    T* dh);
  // Where a step's coefficients (coef: Step::coef) and their gradients lie.
  HyperCoefs<float> Coefs(float* coef) const;
  HyperCoefs<float> GradCoefs() const;

  const bool mhc_;
  const int sublayers_, n_, d_, k_, ld_;  // k_: projection outputs; ld_: k_ rounded up to 8
  const float eps_;
  cudaStream_t stream_;
  core::cuda::GemmHandle* gemm_;
  core::CudaExec exec_;  // stream_, gemm_ and the decoder's workspace
  DeviceArena arena_;
  std::vector<Offsets> off_;
  int rows_ = 0;
  std::vector<Step> steps_;
  T *h_last_ = nullptr, *dnext_ = nullptr, *dh_ = nullptr, *dy_ = nullptr, *du_ = nullptr;
  T* dh0_ = nullptr;
  T* hbar_ = nullptr;     // HC: recomputed RMSNorm(H_j) (N*n, C); its gradient after
  T* dproj_ = nullptr;    // (rows, ld) gradient of the projections
  float* dcoef_ = nullptr;  // (N, n(n+2))
  float *sinkhorn_ = nullptr, *dres_ = nullptr, *dlogits_ = nullptr, *dz_ = nullptr;  // mHC
};

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_GPU_GPU_HYPER_H_
