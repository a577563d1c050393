// model/device_model.h: what the GPU trainer (runtime/cuda_engine.cc) drives: one rank's
// piece of the model (all of it, its TP/EP shard, or a pipeline stage) on one CUDA stream, the
// CPU's classes (DecoderModelT<Cuda<float>> or DecoderModelT<Cuda<__nv_bfloat16>>,
// registry.cc's CreateDeviceModel) behind the few calls a training step makes:
//
//   SATDAR_ASSIGN_OR_RETURN(auto m, DeviceModel::Create(config, {DType::kBF16}, stream, &alloc));
//   m->SetWeights(master);                       // fp32 device buffer, m->params() offsets
//   m->Forward(tokens, B, T, 1.0, loss_acc);     // tokens: host (B, T+1); loss: device fp64 +=
//   m->Backward(grads);                          // grads: device fp32 +=
//
// The parameter table is the CPU model's (same names, shapes and order) with every tensor at a
// multiple of kDeviceParamAlign (layout_check.h), so checkpoints, initialisation and exports
// are shared with the CPU path. bf16 (or f32) activations and compute weights, fp32 master
// weights, gradients and accumulation. The loss stays on the device (DecoderModelT's
// ForwardAccumulate, with the cross-entropy's gradient fused into its forward): a step reads
// nothing back except MoE's expert counts and auxiliary losses (once per MoE layer). The
// statistics of activations (SATFormer's gates, DAR/AttnRes's depth weights) are off until
// SetStatsEnabled(true); on, they accumulate in device memory (one small kernel per layer)
// and are read back only by AppendStats.
#ifndef SATDAR_MODEL_DEVICE_MODEL_H_
#define SATDAR_MODEL_DEVICE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "nlohmann/json.hpp"
#include "model/config.h"
#include "model/layout_check.h"
#include "model/model.h"
#include "model/param_table.h"
#include "model/sharding.h"

struct CUstream_st;  // cudaStream_t

namespace satdar::core::cuda {
class CachingAllocator;
}  // namespace satdar::core::cuda

namespace satdar::model {

struct DeviceModelOptions {
  core::DType compute = core::DType::kBF16;  // activations and compute weights: kBF16 or kF32
  // This rank's piece and how it runs: the whole model by default; under tensor parallelism
  // tp (a communicator of device memory), tp_rank, tp_size and sequence_parallel; under
  // expert parallelism ep, ep_rank, ep_size; a pipeline stage's pp_rank and pp_size (its
  // boundaries are PrepareStage's buffers, moved by the caller). Also
  // vocab_multiple, and recompute: kFull keeps only each sublayer's input (and V1), a
  // branch's internals recomputed right before its backward (kSelective keeps everything on
  // the device: its attention keeps no probabilities to drop). on_device, stream and errors
  // are the model's own.
  Sharding shard;
};

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  // `alloc` serves every device buffer; `stream` runs all work. FailedPrecondition without a
  // CUDA build or device; InvalidArgument for a config the device cannot run
  // (CheckDeviceSupport) or a compute dtype other than bf16 and f32.
  static absl::StatusOr<std::unique_ptr<DeviceModel>> Create(const ModelConfig& config,
                                                             const DeviceModelOptions& options,
                                                             CUstream_st* stream,
                                                             core::cuda::CachingAllocator* alloc);

  virtual const ParamTable& params() const = 0;
  virtual const ModelConfig& config() const = 0;
  // master: fp32 device weights laid out by params(), read in place until the next SetWeights
  // or the model's end (the designs' scalars are read from it); refreshes the compute copy.
  // Call after every change of the master weights.
  virtual absl::Status SetWeights(const float* master) = 0;
  // tokens: host (B, T+1); an id outside [0, vocab) is InvalidArgument. Adds loss_scale *
  // (mean cross-entropy + the auxiliary losses) to *loss_acc (device fp64) and keeps what
  // Backward needs; the gradient of the cross-entropy (scaled by loss_scale) is computed here.
  virtual absl::Status Forward(const int32_t* tokens, int b, int t, double loss_scale,
                               double* loss_acc) = 0;
  // Validation: adds the mean cross-entropy alone (no auxiliary losses) to *ce_acc (device
  // fp64); keeps nothing for a Backward (which then fails with FailedPrecondition).
  virtual absl::Status Evaluate(const int32_t* tokens, int b, int t, double* ce_acc) = 0;
  // grads (device fp32, laid out by params()) += d(loss_scale * loss)/d(params) of the last
  // Forward.
  virtual absl::Status Backward(float* grads) = 0;
  // Another instance of this model (a pipeline chunk keeps one per micro-batch in flight): its
  // own activations and boundary buffers, and this one's weights (a SetWeights on any instance
  // serves all), stream, GEMM handle and workspace. It starts with this instance's statistics
  // switch (SetStatsEnabled sets one instance's).
  virtual absl::StatusOr<std::unique_ptr<DeviceModel>> NewInstance() = 0;
  // Pipeline stages (shard.pp_size > 1): sizes what crosses this stage's boundaries for (B, T)
  // micro-batches (model.h's StageBuffers, device memory of the compute dtype) and returns their
  // views, valid until the next PrepareStage; an allocation failure is returned.
  virtual absl::StatusOr<StageViews> PrepareStage(int b, int t) = 0;
  // As Model::SetLayerGradientsReadyHook: called (at enqueue time, on the host) once all of
  // layer i's gradient work is enqueued on the stream, for layers L-1 .. 1.
  virtual void SetLayerGradientsReadyHook(std::function<void(int layer)> hook) = 0;
  // Bytes of device memory the model holds beyond the weights: (B, T) activations, the ops'
  // scratch and the KV cache of BeginDecode.
  virtual int64_t activation_bytes() const = 0;
  // As Model's: the statistics of SATFormer's gates and DAR/AttnRes's depth weights are off
  // until SetStatsEnabled(true) (then device accumulators, read by AppendStats with one wait
  // for the stream); expert load is always counted.
  virtual void SetStatsEnabled(bool on) = 0;
  virtual void AppendStats(nlohmann::json* stats) const = 0;
  virtual void ResetStats() = 0;
  // SATFormer's gate intervention (Model::SetGateAblation); false when the model has no gates.
  virtual bool SetGateAblation(GateAblation mode) = 0;
  // Incremental decoding as Model::BeginDecode / Model::DecodeStep, over the weights of the last
  // SetWeights: tokens are host ids (B, tn), *logits host doubles (B, rows, vocab_size).
  virtual absl::Status BeginDecode(int b, int capacity) = 0;
  virtual absl::Status DecodeStep(const int32_t* tokens, int b, int tn, bool all_rows,
                                  std::vector<double>* logits) = 0;
};

}  // namespace satdar::model

#endif  // SATDAR_MODEL_DEVICE_MODEL_H_
