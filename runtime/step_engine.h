// runtime/step_engine.h: what an optimizer step does to one rank's model on one device, behind
// one interface, so that the training loop (trainer.cc: setup, resume, the steps, logging,
// timing, checkpoint cadence, evaluation, the summary) is written once for every device.
//
//   engine->ForwardBackward(micro)   loss of the step, gradients reduced over the replicas
//   engine->GradNorm()               the global norm of those gradients
//   engine->Update(hp)               AdamW (clipping through hp.grad_scale)
//
// Implementation: Engine<B, M> (engine.h), written once for both devices, with the hooks of
// CpuEngine (cpu_engine.cc: Model<T> on the host, f32 or f64) and CudaEngine (cuda_engine.cc:
// DeviceModel, fp32 master weights on a GPU, device communicators: NCCL, or host staging for
// ranks that share a GPU). Every dp x tp x pp x ep layout, ZeRO-1 and statistics on both.
#ifndef SATDAR_RUNTIME_STEP_ENGINE_H_
#define SATDAR_RUNTIME_STEP_ENGINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "core/ops/adamw.h"
#include "data/batches.h"
#include "model/param_table.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint.h"
#include "runtime/train_options.h"

namespace satdar::runtime {

enum class LoadWhat { kFullState, kWeightsOnly };

class StepEngine {
 public:
  virtual ~StepEngine() = default;

  // This rank's parameter table (its piece of the model).
  virtual const model::ParamTable& params() const = 0;
  // The console's "model: ..." line, and where this rank runs for error messages ("dp=2 tp=1
  // pp=1 ep=1", "cuda:0").
  virtual std::string Describe() const = 0;
  virtual std::string Where() const = 0;

  // Replaces the initial state (seeded weights, zero moments) by a checkpoint's: all of it
  // (a resume), or its weights only, the moments staying zero (--init-from, fine-tuning).
  virtual absl::StatusOr<CheckpointInfo> Load(const std::string& path,
                                              const std::string& config_json, LoadWhat what) = 0;
  // One step's forward and backward passes over its micro-batches (tokens (B, T+1) each, B =
  // batch_size / microbatches), then every reduction of the gradients. Returns the step's
  // loss: the mean over micro-batches, averaged over the replicas.
  virtual absl::StatusOr<double> ForwardBackward(std::vector<std::vector<int32_t>>* micro) = 0;
  virtual absl::StatusOr<double> GradNorm() = 0;
  virtual absl::Status Update(const core::AdamWParams& hp) = 0;
  // The mean cross-entropy of the first `batches` micro-batch-sized batches of `source`.
  virtual absl::StatusOr<double> ValidationLoss(data::BatchSource* source, int batches) = 0;

  // What this device measures, added to a step's log line (which has "tokens_per_second"):
  // bytes per group and boundary since the last call, memory, MFU.
  virtual absl::Status AddToLog(nlohmann::json* line) = 0;
  // The peak FLOP/s per rank this engine's MFU divides by; 0 when it logs no MFU itself.
  virtual double PeakFlops() const { return 0; }
  // Seconds this rank spent blocked in communication since the last call: *collective in the
  // data, tensor and expert groups' collectives, *pipeline waiting for a neighbouring stage
  // (the pipeline bubble). Engines that do not measure it report 0.
  virtual void TakeCommWait(double* collective, double* pipeline) {
    *collective = *pipeline = 0;
  }
  // The papers' statistics (gates, depth weights, expert load) gathered since the last call,
  // as the line's "stats".
  virtual absl::Status AddStats(nlohmann::json* line) = 0;
  // A copy of the whole model's master weights in f32 on the host, laid out by `whole` (the
  // unsharded CPU model's table, model::BuildParamTable(config, {})): what samples during
  // training decode. Reads this rank's buffers (on a GPU after the step's work), changes
  // nothing, talks to no other rank. FailedPrecondition naming a tensor this rank holds only a
  // piece of, or none of (TP slices, other pipeline stages, other ranks' experts).
  virtual absl::StatusOr<std::vector<float>> WholeWeights(const model::ParamTable& whole) = 0;
  // Writes the state of `info.step` (every rank takes part; the engine decides which write).
  virtual absl::Status Save(const CheckpointInfo& info) = 0;
  virtual void AddToSummary(double tokens_per_second, nlohmann::json* summary,
                            TrainSummary* out) = 0;
  // After a failed step: waits for the collectives still in flight (each ends by completing
  // or timing out), so no device work waits on a peer when the buffers are freed.
  virtual void Abandon() {}
};

// What the engines' pipeline needs of options built in code (the flags and job specs are
// checked when parsed): virtual stages only with pp 2 or more, and then micro-batches in groups
// of pp. InvalidArgument naming the fields.
inline absl::Status CheckPipelineOptions(const TrainOptions& o) {
  if (o.virtual_stages == 1) return absl::OkStatus();
  if (o.mesh.pp < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "virtual_stages %d needs pp 2 or more, got pp %d", o.virtual_stages, o.mesh.pp));
  }
  if (o.microbatches % o.mesh.pp != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "virtual_stages %d needs microbatches a multiple of pp %d, got %d", o.virtual_stages,
        o.mesh.pp, o.microbatches));
  }
  return absl::OkStatus();
}

// The pipeline line of an engine's Describe (with its leading newline); empty without
// pipeline stages.
inline std::string DescribePipeline(const TrainOptions& o) {
  const int pp = o.mesh.pp, v = o.virtual_stages;
  if (pp == 1) return "";
  const int layers = o.config.num_hidden_layers / (pp * v);
  if (v == 1) {
    return absl::StrFormat("\npipeline: %d stages of %d layers, 1F1B over %d micro-batches", pp,
                           layers, o.microbatches);
  }
  return absl::StrFormat(
      "\npipeline: %d stages x %d virtual stages of %d layers, interleaved 1F1B over %d "
      "micro-batches",
      pp, v, layers, o.microbatches);
}

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_STEP_ENGINE_H_
