// model/gpu/gpu_model.h: the decoder of model/decoder.h on one GPU, with the CUDA kernels of
// core/ops and model/layers: bf16 (or f32) activations and compute weights, fp32 master
// weights, fp32 gradients and fp32 accumulation everywhere.
//
//   SATDAR_ASSIGN_OR_RETURN(auto m, GpuModel::Create(config, {DType::kBF16, false}, stream, &alloc));
//   m->SetWeights(master);                       // fp32 device buffer, m->params() offsets
//   m->Forward(tokens, B, T, 1.0, loss_acc);     // tokens: host (B, T+1); loss: device fp64 +=
//   m->Backward(grads);                          // grads: device fp32 +=
//
// The parameter table is the CPU model's (same names, shapes and order; offsets aligned to
// kDeviceAlign), so checkpoints, initialisation and exports are shared with the CPU path. Everything is
// enqueued on one stream and nothing synchronises with the host except the token upload's
// reuse of its pinned staging buffer. Designs: every residual topology (standard here; DAR and
// AttnRes in gpu_depth.h, DenseFormer in gpu_denseformer.h, HC and mHC in gpu_hyper.h,
// MUDDFormer in gpu_muddformer.h, each driving the decoder's branches through callbacks),
// every value residual (SATFormer's gate, ResFormer's mix), dense SwiGLU or MoE FFNs
// (gpu_moe.h; no expert parallelism); one rank's whole model (data parallelism is the
// trainer's). CheckGpuSupport names the config
// field of anything else. As in llm.c, the bf16 path also keeps the residual stream, DAR's
// states and their gradients in bf16 (each add and accumulation is done in fp32 and rounded).
#ifndef SATDAR_MODEL_GPU_GPU_MODEL_H_
#define SATDAR_MODEL_GPU_GPU_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/param_table.h"

struct CUstream_st;  // cudaStream_t

namespace satdar::core::cuda {
class CachingAllocator;
}  // namespace satdar::core::cuda

namespace satdar::model::gpu {

struct GpuModelOptions {
  core::DType compute = core::DType::kBF16;  // activations and compute weights: kBF16 or kF32
  // Activation recomputation: keep only each sublayer's input (and V1); a branch's internals
  // (norms, q/k/v, attention output, SwiGLU) are recomputed right before its backward.
  bool recompute = false;
};

// OK when the GPU path has this design; otherwise InvalidArgument naming the field.
absl::Status CheckGpuSupport(const ModelConfig& config);

// The GPU's parameter tables start every tensor at a multiple of kDeviceAlign elements
// (ParamTable's align): the flat buffers (master weights, gradients, AdamW moments) hold the
// same tensors as the CPU's packed table, with zero padding between them. Checkpoints are
// written per tensor, so they move between the two.
constexpr int64_t kDeviceAlign = 32;

class GpuModel {
 public:
  virtual ~GpuModel() = default;
  // `alloc` serves every device buffer (its stats give the peak memory); `stream` runs all
  // work. Fails without a CUDA build or device.
  static absl::StatusOr<std::unique_ptr<GpuModel>> Create(const ModelConfig& config,
                                                          const GpuModelOptions& options,
                                                          CUstream_st* stream,
                                                          core::cuda::CachingAllocator* alloc);

  virtual const ParamTable& params() const = 0;
  virtual const ModelConfig& config() const = 0;
  // master: fp32 device weights laid out by params() (align kDeviceAlign), read in place until the model is destroyed (the
  // scalar parameters of DAR are read from it); refreshes the compute copy. Call after every
  // change of the master weights.
  virtual absl::Status SetWeights(const float* master) = 0;
  // tokens: host (B, T+1); an id outside [0, vocab) is an InvalidArgument error. Adds loss_scale * mean
  // cross-entropy to *loss_acc (device fp64) and keeps what Backward needs; the gradient of
  // the loss (scaled by loss_scale) is computed here, fused with the cross-entropy.
  virtual absl::Status Forward(const int32_t* tokens, int b, int t, double loss_scale,
                               double* loss_acc) = 0;
  // Validation: adds the mean cross-entropy alone (no MoE aux or z loss) to *ce_acc (device
  // fp64); keeps nothing for a Backward (which then fails).
  virtual absl::Status Evaluate(const int32_t* tokens, int b, int t, double* ce_acc) = 0;
  // grads (device fp32, laid out by params()) += d(loss_scale * loss)/d(params) of the last Forward.
  virtual absl::Status Backward(float* grads) = 0;
  // As Model::SetLayerGradientsReadyHook: called (at enqueue time, on the host) once all of
  // layer i's gradient work is enqueued on the stream, for layers L-1 .. 1.
  virtual void SetLayerGradientsReadyHook(std::function<void(int layer)> hook) = 0;
  // Bytes of device memory the model holds for (B, T) activations and scratch.
  virtual int64_t activation_bytes() const = 0;
};

}  // namespace satdar::model::gpu

#endif  // SATDAR_MODEL_GPU_GPU_MODEL_H_
