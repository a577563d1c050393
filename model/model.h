// model/model.h: what the trainer and `satdar grad` see of a model.
//
//   SATDAR_ASSIGN_OR_RETURN(auto model, CreateModel<float>(config, &pool));
//   model->params().Initialize(params, seed);
//   SATDAR_ASSIGN_OR_RETURN(double loss, model->Forward(params, tokens, B, T));  // (B, T+1)
//   SATDAR_RETURN_IF_ERROR(model->Backward(params, grads, 1.0));  // grads += d loss / d params
//
// A model keeps the activations of its last Forward for the Backward that follows. T is the
// compute type (float, or double for gradient checks and `satdar grad --dtype f64`).
#ifndef SATDAR_MODEL_MODEL_H_
#define SATDAR_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/param_table.h"
#include "model/sharding.h"
#include "model/value_residual.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

// Pipeline parallelism: what crosses this stage's boundaries, one flat buffer per tensor (the
// topology's state tensors, (B*T, C) each, then V1 when the design has a value residual).
//   in:   received from the previous stage before Forward (empty on the first stage)
//   out:  sent to the next stage after Forward (empty on the last stage)
//   dout: received from the next stage before Backward (the gradients of out)
//   din:  sent to the previous stage after Backward (the gradients of in)
// Buffers of the backend B (model/backend.h): host memory on the CPU, device memory on CUDA.
template <class B>
struct StageBuffersT {
  std::vector<typename B::template Vec<typename B::T>> in, out, dout, din;
};
template <typename T>
using StageBuffers = StageBuffersT<Cpu<T>>;

// The same boundary tensors as a communicator moves them (parallel/pipeline.h): untyped
// pointers into the backend's memory, their element counts and one element type.
struct BoundaryView {
  void* data;
  size_t count;
};
struct StageViews {
  core::DType dtype = core::DType::kF32;
  std::vector<BoundaryView> in, out, dout, din;
};
// Views of `s`, whose elements are of type `dtype`; valid until s is resized.
template <class B>
StageViews ViewsOf(StageBuffersT<B>* s, core::DType dtype) {
  StageViews v;
  v.dtype = dtype;
  auto view = [](auto& from, std::vector<BoundaryView>* to) {
    for (auto& t : from) to->push_back({static_cast<void*>(t.data()), t.size()});
  };
  view(s->in, &v.in);
  view(s->out, &v.out);
  view(s->dout, &v.dout);
  view(s->din, &v.din);
  return v;
}

// Stage: the boundary buffers' type; the default is the CPU's, so Model<T> is the CPU model
// every caller knows. A model on a device (decoder.h, DecoderModelT<Cuda<T>>) derives from
// Model<T, StageBuffersT<Cuda<T>>>, a different class, so device buffers never pass for host
// ones.
// One residual stream's state at one depth, (B*T, C) row-major (Model::DepthStates).
struct DepthState {
  int stream = 0;
  int depth = 0;     // 0: the embedding
  int sublayer = 0;  // the sublayers it has seen (depth's position in the 2L sublayers)
  std::vector<double> values;
};

template <typename T, class Stage = StageBuffers<T>>
class Model {
 public:
  virtual ~Model() = default;
  virtual const ParamTable& params() const = 0;
  virtual const ModelConfig& config() const = 0;
  // tokens (B, T+1): inputs are tokens[:, :T], targets tokens[:, 1:]. Returns the mean loss
  // over the B*T positions; InvalidArgument for an id outside [0, vocab_size) (nothing is
  // computed), or the first failure of a collective of this pass (Sharding::errors).
  virtual absl::StatusOr<double> Forward(const T* params, const int32_t* tokens, int b, int t) = 0;
  // grads (params().size()) += loss_scale * d(loss)/d(params) for the last Forward; the first
  // failure of a collective of this pass, or OK.
  virtual absl::Status Backward(const T* params, T* grads, double loss_scale) = 0;
  // The cross-entropy part of the last Forward's loss (without auxiliary losses).
  virtual double last_cross_entropy() const = 0;
  // What the papers analyse (gates, depth weights, expert load), gathered since ResetStats.
  virtual void AppendStats(nlohmann::json* stats) const = 0;
  virtual void ResetStats() = 0;
  // Whether passes gather the statistics that read activations (SATFormer's gates and their
  // mean ablation, DAR's and AttnRes's depth weights); on by default. They accumulate in
  // the backend's memory (ops::AccumulateColumns; a device's are read back by AppendStats
  // alone), and a trainer that reports none turns them off; what was gathered stays until
  // ResetStats. Expert load is always counted (the routing
  // reads its counts anyway).
  virtual void SetStatsEnabled(bool on) = 0;
  // SATFormer's gate intervention; false when the model has no gates.
  virtual bool SetGateAblation(GateAblation mode) = 0;
  // After a Forward (before Backward): the argmax prediction at every position (B*T).
  virtual void Predictions(std::vector<int32_t>* argmax) const = 0;
  // Called during Backward with layer i as soon as no later part of the pass writes layer i's
  // parameter gradients (layers L-1 .. 1, in that order; layer 0 and the non-layer parameters
  // are final only when Backward returns). Data parallelism starts each layer's gradient
  // reduction there, overlapping it with the rest of the backward pass. Empty: no calls.
  virtual void SetLayerGradientsReadyHook(std::function<void(int layer)> hook) = 0;
  // After a Forward: layer i's SATFormer gates (B*T, NKV), or false when it has none.
  virtual bool GateValues(int layer, std::vector<double>* gates) const = 0;
  // Sizes this stage's boundary buffers for (B, T) micro-batches. On a pipeline stage other
  // than the last, Forward returns its layers' auxiliary losses (the cross-entropy is the last
  // stage's) and Backward starts from
  // dout; on one other than the first, Forward starts from in.
  virtual Stage* PrepareStage(int b, int t) = 0;
  // Incremental decoding (generation and task evaluation, runtime/decode_session.h).
  // BeginDecode: b sequences with room for `capacity` positions each (<= max_position_embeddings),
  // dropping any earlier cache; FailedPrecondition on a sharded model or pipeline stage.
  virtual absl::Status BeginDecode(int b, int capacity) = 0;
  // tokens: host (B, tn) ids at every sequence's next tn positions (the sequences of a batch
  // advance together). *logits = (B, rows, vocab_size) doubles, rows = tn when all_rows, else 1
  // (each sequence's last new position); padded vocab columns are left out. OutOfRange when the
  // positions would pass capacity; InvalidArgument for an id outside [0, vocab_size).
  // SetGateAblation applies; statistics accumulate as in Forward when enabled.
  virtual absl::Status DecodeStep(const T* params, const int32_t* tokens, int b, int tn,
                                  bool all_rows, std::vector<double>* logits) = 0;

  // Analyses of the residual streams (runtime/analysis.h: CKA, rescue), on the whole model
  // (FailedPrecondition on a shard or pipeline stage; Unimplemented where the master weights
  // are not T). ResidualStreams: 2 for DAR, hc_streams for HC/mHC, 1 for the others.
  virtual int ResidualStreams() const = 0;
  // After a Forward: the states the topology keeps by stream and depth, read back as host
  // doubles: DAR's history entries of each stream (depth j = after j blocks; the embedding is
  // depth 0 of both), HC/mHC's streams after every layer (depth 0: the embedding); none for
  // one-stream designs.
  virtual absl::Status DepthStates(std::vector<DepthState>* states) const = 0;
  // The pass split after sublayer `at`, between two layers (at = 2, 4, .., 2L-2, where a
  // pipeline can split; InvalidArgument otherwise): ForwardToState runs tokens (B, T+1)
  // through sublayers 1..at and reads back the state there, the pipeline boundary's tensors
  // ((B*T, C) each; TopologyBoundaryTensors) then V1 when the design has a value residual;
  // (*owner)[i] is the stream tensor i belongs to, or -1 when every stream reads it (DAR's
  // embedding entry, V1). ForwardFromState runs sublayers at+1..2L from such a state and
  // returns the mean cross-entropy of tokens' targets (tokens[:, 1:]; the inputs are not
  // read: the state carries them), without auxiliary losses; *losses (unless null) = each
  // of the B*T positions' cross-entropy.
  virtual absl::Status ForwardToState(const T* params, const int32_t* tokens, int b, int t,
                                      int at, std::vector<std::vector<double>>* state,
                                      std::vector<int>* owner) = 0;
  virtual absl::StatusOr<double> ForwardFromState(
      const T* params, const int32_t* tokens, int b, int t, int at,
      const std::vector<std::vector<double>>& state, std::vector<double>* losses) = 0;
};

// The registry (model/registry.cc): builds the model that `config` describes, or says
// which config field names a design this build does not have.
template <typename T>
absl::StatusOr<std::unique_ptr<Model<T>>> CreateModel(const ModelConfig& config,
                                                      core::ThreadPool* pool);
// This rank's piece of the model (sharding.h); the first overload is the whole model.
template <typename T>
absl::StatusOr<std::unique_ptr<Model<T>>> CreateModel(const ModelConfig& config,
                                                      const Sharding& shard,
                                                      core::ThreadPool* pool);

// This rank's parameter table (names, shapes, offsets, sharding flags) without building the
// model: what checkpoints, the planner and the GPU path read. InvalidArgument for a layout
// the config cannot be split into (layout_check.h). align: every tensor starts at a multiple
// of `align` elements (ParamTable; the CPU models bind align 1, whose q/k/v and gate/up are
// adjacent for their fused GEMMs).
absl::StatusOr<ParamTable> BuildParamTable(const ModelConfig& config, const Sharding& shard,
                                           int64_t align = 1);

// What the built topology of `config` says of itself (Topology::SupportsStages); the layout
// check reads the design table instead (layout_check.h), which a test holds to this.
bool TopologySupportsStages(const ModelConfig& config);
// How many (B*T, C) tensors the topology's state after sublayer l is (Topology::
// BoundaryTensors): what a pipeline boundary there carries besides V1.
int TopologyBoundaryTensors(const ModelConfig& config, int after_sublayer);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_MODEL_H_
