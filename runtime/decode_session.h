// runtime/decode_session.h: a model with its weights loaded, decoding incrementally over a KV
// cache (Model::BeginDecode / DecodeStep) on the CPU or a GPU: what `satdar generate`, the
// task evaluation and sampling during training drive.
//
//   SATDAR_ASSIGN_OR_RETURN(auto s, DecodeSession::Create(options));
//   SATDAR_RETURN_IF_ERROR(s->Begin(1, prompt.size() + 16));
//   SATDAR_RETURN_IF_ERROR(s->Step(prompt.data(), 1, prompt.size(), false, &logits));
//   ... s->Step(&next, 1, 1, false, &logits) ...
//
// The statistics of activations (SATFormer's gates, depth weights) are off until
// SetStatsEnabled(true) on both devices: decoding reads none of them.
#ifndef SATDAR_RUNTIME_DECODE_SESSION_H_
#define SATDAR_RUNTIME_DECODE_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/value_residual.h"

namespace satdar::runtime {

struct DecodeOptions {
  model::ModelConfig config;
  std::string weights;     // safetensors weights (init/export/PyTorch) or a single-file checkpoint
  std::string checkpoint;  // or: a checkpoint file or folder of any layout (exactly one of the two)
  std::string device = "cpu";          // cpu | cuda | cuda:N
  core::DType dtype = core::DType::kF32;  // cpu: kF32 | kF64; cuda: kF32 | kBF16
  int threads = 1;
  model::GateAblation gate_ablation = model::GateAblation::kNone;
};

class DecodeSession {
 public:
  // Builds the model on options.device and loads its weights (runtime/weights.h,
  // LoadModelWeights). InvalidArgument naming the field (device, dtype, weights, checkpoint,
  // gate_ablation) or file; FailedPrecondition from the device.
  static absl::StatusOr<std::unique_ptr<DecodeSession>> Create(const DecodeOptions& options);
  // A CPU session over weights already in memory (laid out by the CPU model's param table),
  // for sampling during training. InvalidArgument when params is not the table's size.
  static absl::StatusOr<std::unique_ptr<DecodeSession>> FromParams(const model::ModelConfig& config,
      std::vector<float> params, int threads);
  // The same in f64 (the overload is chosen by the vector's type): for tests that compare
  // decoding against a full f64 forward pass.
  static absl::StatusOr<std::unique_ptr<DecodeSession>> FromParams(const model::ModelConfig& config,
      std::vector<double> params, int threads);
  virtual ~DecodeSession() = default;
  virtual const model::ModelConfig& config() const = 0;
  int window() const { return config().max_position_embeddings; }
  virtual absl::Status Begin(int b, int capacity) = 0;                 // Model::BeginDecode
  virtual absl::Status Step(const int32_t* tokens, int b, int tn, bool all_rows,
                            std::vector<double>* logits) = 0;          // Model::DecodeStep
  virtual bool SetGateAblation(model::GateAblation mode) = 0;
  virtual void SetStatsEnabled(bool on) = 0;
  virtual void ResetStats() = 0;
};

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_DECODE_SESSION_H_
