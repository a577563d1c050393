// model/decoder.h: every model of the spec is this decoder: token embedding, a residual
// topology over 2L branches (attention with an optional value residual, dense or MoE FFN),
// the final RMSNorm, a tied or untied head and mean cross-entropy plus the FFNs' auxiliary
// losses. The registry (registry.cc) picks the components from the config.
#ifndef SATDAR_MODEL_DECODER_H_
#define SATDAR_MODEL_DECODER_H_

#include <memory>
#include <utility>
#include <vector>

#include "model/branches.h"
#include "model/model.h"
#include "model/param_layout.h"
#include "model/topology.h"

namespace satdar::model {

// Templated on the backend B (model/backend.h). Model<T>'s entry points (the CPU's one
// parameter buffer) read it as both the compute and the master weights; the Weights<B>
// overloads take them apart (on Cuda<bf16> bf16 compute weights, fp32 master weights and
// gradients). On a device (B::kDevice) the base is Model<T, StageBuffersT<B>> (model.h), the
// tokens are host memory (uploaded), and the host reads the losses, predictions and gates
// through explicit device-to-host copies (ops::Download).
template <class B>
class DecoderModelT : public Model<typename B::T, StageBuffersT<B>> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // table: this rank's DecoderParams (param_layout.h) for the same design and sharding.
  DecoderModelT(const ModelConfig& config, const Sharding& shard, const typename B::Exec& x,
                ParamTable table, std::unique_ptr<BranchesT<B>> branches,
                std::unique_ptr<TopologyT<B>> topology);

  const ParamTable& params() const override { return table_; }
  const ModelConfig& config() const override { return config_; }
  // Model<T>: params are both weights (on Cuda<bf16>, whose master weights are fp32,
  // Unimplemented: use the Weights<B> overloads).
  absl::StatusOr<double> Forward(const T* params, const int32_t* tokens, int b, int t) override;
  absl::Status Backward(const T* params, T* grads, double loss_scale) override;
  // The same passes with the compute and master weights apart; grads (params().size()) of
  // Acc. tokens are host memory on every backend.
  absl::StatusOr<double> Forward(const Weights<B>& w, const int32_t* tokens, int b, int t);
  absl::Status Backward(const Weights<B>& w, Acc* grads, double loss_scale);
  // Where a pass that reads nothing back puts its loss (the GPU trainer's: no host sync per
  // step). acc: one double in the backend's memory (device memory on CUDA).
  struct LossSink {
    double* acc = nullptr;
    double scale = 1.0;  // the micro-batch's share of the step's loss
    bool train = true;
  };
  // The forward pass with its loss left in the backend. train: *sink.acc += sink.scale *
  // (mean cross-entropy + this stage's auxiliary losses), and the cross-entropy's gradient
  // (times sink.scale) is computed here, in one pass over the logits on CUDA, so the next
  // Backward (whose loss_scale then only scales the auxiliary losses) starts from it.
  // !train (evaluation): *sink.acc += sink.scale * mean cross-entropy, nothing else; a Backward
  // after it is FailedPrecondition. last_cross_entropy() is NaN after either (not read back).
  absl::Status ForwardAccumulate(const Weights<B>& w, const int32_t* tokens, int b, int t,
                                 const LossSink& sink);
  double last_cross_entropy() const override { return cross_entropy_; }
  void AppendStats(nlohmann::json* stats) const override;
  void ResetStats() override;
  void SetStatsEnabled(bool on) override;
  bool SetGateAblation(GateAblation mode) override;
  void Predictions(std::vector<int32_t>* argmax) const override;
  bool GateValues(int layer, std::vector<double>* gates) const override;
  void SetLayerGradientsReadyHook(std::function<void(int layer)> hook) override {
    branches_->SetLayerGradientsReadyHook(std::move(hook));
  }
  // Incremental decoding (model.h): the whole model in one process (FailedPrecondition on a
  // shard or pipeline stage). A step is the forward pass of the new positions alone, their
  // attention reading the branches' KV cache (branches.h); no loss, the auxiliary losses
  // dropped. Forward and Backward stay usable between steps and leave the cache alone.
  absl::Status BeginDecode(int b, int capacity) override;
  absl::Status DecodeStep(const T* params, const int32_t* tokens, int b, int tn, bool all_rows,
                          std::vector<double>* logits) override;
  absl::Status DecodeStep(const Weights<B>& w, const int32_t* tokens, int b, int tn,
                          bool all_rows, std::vector<double>* logits);
  // Analyses (model.h; definitions in decoder_analysis.cc).
  int ResidualStreams() const override { return topology_->streams(); }
  absl::Status DepthStates(std::vector<DepthState>* states) const override;
  absl::Status ForwardToState(const T* params, const int32_t* tokens, int b, int t, int at,
                              std::vector<std::vector<double>>* state,
                              std::vector<int>* owner) override;
  absl::StatusOr<double> ForwardFromState(const T* params, const int32_t* tokens, int b, int t,
                                          int at,
                                          const std::vector<std::vector<double>>& state,
                                          std::vector<double>* losses) override;
  // A failed Resize (an allocation on a device) is kept and returned by the next Forward.
  StageBuffersT<B>* PrepareStage(int b, int t) override {
    absl::StatusOr<StageBuffersT<B>*> stage = PrepareStageOrError(b, t);
    if (pending_.ok()) pending_ = stage.status();
    return &stage_;
  }
  // PrepareStage with the allocation's outcome: the sized buffers, or the failure (a pipeline
  // must not send or receive through a buffer that is short).
  absl::StatusOr<StageBuffersT<B>*> PrepareStageOrError(int b, int t) {
    absl::Status status = Resize(b, t);
    if (!status.ok()) return status;
    return &stage_;
  }

 private:
  // sink: null for Forward (the loss is read back and returned), else ForwardAccumulate's.
  absl::StatusOr<double> ForwardPass(const Weights<B>& w, const int32_t* tokens, int b, int t,
                                     const LossSink* sink);
  absl::Status CheckTokens(const int32_t* tokens, int b, int t) const;
  // tokens (B, T+1) -> inputs_ (tokens[:, :T]) and targets_ (tokens[:, 1:]), uploaded.
  absl::Status UploadTokens(const int32_t* tokens, int b, int t);
  // ForwardPass from x_final_: the final norm, the head and the loss (as ForwardPass returns).
  absl::StatusOr<double> HeadPass(const Weights<B>& w, const LossSink* sink);
  // The analyses' common start: the whole model and a split sublayer `at` between layers, tokens
  // checked, buffers sized, tokens split and uploaded, weights set.
  absl::Status BeginAnalysisPass(const char* what, const Weights<B>& w, const int32_t* tokens,
                                 int b, int t, int at);
  absl::Status BackwardPass(const Weights<B>& w, Acc* grads, double loss_scale);
  // The first failure of a collective inside a pass (Sharding::errors), or OK.
  absl::Status CommStatus() const {
    return shard_.errors == nullptr ? absl::OkStatus() : shard_.errors->status();
  }
  // Sizes every buffer for (b, t) in its own AllocScope; on a failure the next call retries.
  // inference: for decode steps (branches.h Resize).
  absl::Status Resize(int b, int t, bool inference = false);
  absl::Status ResizeBuffers(int b, int t, bool inference);
  // DecodeStep after its checks: the pass and the logits read back.
  absl::Status DecodePass(const Weights<B>& w, const int32_t* tokens, int b, int tn,
                          bool all_rows, std::vector<double>* logits);
  // Vocabulary-parallel pieces (tp > 1): this rank holds rows [v0_, v0_ + vl_) of the padded
  // vocabulary, the first vtrue_ of them true rows.
  absl::Status EmbeddingForward(const T* table, T* h0);
  absl::Status EmbeddingBackward(Acc* dtable);
  // losses_ = the cross-entropy of each of the B*T positions (with the TP reductions).
  absl::Status CrossEntropyLosses();
  // *loss = the mean of losses_, read back and summed on the host in order.
  absl::Status MeanLoss(double* loss);
  absl::Status CrossEntropyBackward(double loss_scale);
  // ForwardAccumulate's loss: losses_ (with the gradient of the logits when training) into
  // the sink, plus the auxiliary losses when training.
  absl::Status LossIntoSink(const LossSink& sink);

  ModelConfig config_;
  Sharding shard_;
  int first_sublayer_, last_sublayer_;  // this pipeline stage's sublayers (1-based)
  bool has_embedding_;
  int v0_, vl_, vtrue_;
  const typename B::Exec x_;
  std::unique_ptr<BranchesT<B>> branches_;
  std::unique_ptr<TopologyT<B>> topology_;
  ParamTable table_;
  int64_t embed_off_, norm_off_, head_off_;
  int b_ = 0, t_ = 0;
  bool inference_ = false;  // the buffers are sized for decode steps (no probabilities)
  double cross_entropy_ = 0;
  // The last forward pass: kNone (none, or an evaluation), kTrain (Forward; Backward computes
  // the cross-entropy's gradient) or kFused (ForwardAccumulate computed it already).
  enum class Pass { kNone, kTrain, kFused };
  Pass pass_ = Pass::kNone;
  absl::Status pending_;  // a failed PrepareStage, returned by the next Forward
  // (B*T) token ids: split on the host, then uploaded into the backend's buffers.
  std::vector<int32_t> host_inputs_, host_targets_;
  Vec<int32_t> inputs_, targets_;
  int rows_ = 0;  // token rows of the residual stream here (B*T, or B*T/tp under SP)
  Vec<T> h0_, x_final_, lnf_, logits_;
  Vec<Acc> lnf_rstd_, losses_;  // fp32 on a device (the CUDA ops' statistics and losses)
  std::vector<Acc> host_losses_;  // the losses read back for the sum
  // SP: a (B*T, C) scratch (the embedding's partial sums, dh0 gathered), this rank's normed
  // rows and their gradient.
  Vec<T> full_, lnf_local_, dnorm_local_;
  Vec<T> dnorm_, dx_final_, dh0_;
  Vec<Acc> row_max_, row_lse_;  // vocabulary-parallel cross-entropy per position (fp32)
  StageBuffersT<B> stage_;
  std::vector<Vec<T>> analysis_state_;  // ForwardToState's and ForwardFromState's state
};

template <typename T>
using DecoderModel = DecoderModelT<Cpu<T>>;

// The registry's rows on a device (registry.cc), B = Cuda<float> or Cuda<__nv_bfloat16> in
// CUDA builds: this rank's model for any design, its table aligned to kDeviceParamAlign (the
// GPU's, BuildParamTable(config, shard, kDeviceParamAlign)). A config or sharding the CPU
// registry refuses: its error; one the kernels cannot take: CheckDeviceSupport's
// (layout_check.h); x without a GEMM handle or allocator: FailedPrecondition. Under tp or
// ep > 1 the Sharding's communicators must move device memory and its on_device/stream be
// set (its collectives wait on that stream).
template <class B>
absl::StatusOr<std::unique_ptr<DecoderModelT<B>>> CreateDeviceModel(const ModelConfig& config,
                                                                   const Sharding& shard,
                                                                   const typename B::Exec& x);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_DECODER_H_
