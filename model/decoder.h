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
  double last_cross_entropy() const override { return cross_entropy_; }
  void AppendStats(nlohmann::json* stats) const override;
  void ResetStats() override;
  bool SetGateAblation(GateAblation mode) override;
  void Predictions(std::vector<int32_t>* argmax) const override;
  bool GateValues(int layer, std::vector<double>* gates) const override;
  void SetLayerGradientsReadyHook(std::function<void(int layer)> hook) override {
    branches_->SetLayerGradientsReadyHook(std::move(hook));
  }
  // A failed Resize (an allocation on a device) is kept and returned by the next Forward.
  StageBuffersT<B>* PrepareStage(int b, int t) override {
    typename B::AllocScope scope(x_);
    absl::Status status = Resize(b, t);
    if (status.ok()) status = scope.status();
    if (pending_.ok()) pending_ = std::move(status);
    return &stage_;
  }

 private:
  absl::StatusOr<double> ForwardPass(const Weights<B>& w, const int32_t* tokens, int b, int t);
  absl::Status BackwardPass(const Weights<B>& w, Acc* grads, double loss_scale);
  // The first failure of a collective inside a pass (Sharding::errors), or OK.
  absl::Status CommStatus() const {
    return shard_.errors == nullptr ? absl::OkStatus() : shard_.errors->status();
  }
  absl::Status Resize(int b, int t);
  // Vocabulary-parallel pieces (tp > 1): this rank holds rows [v0_, v0_ + vl_) of the padded
  // vocabulary, the first vtrue_ of them true rows.
  absl::Status EmbeddingForward(const T* table, T* h0);
  absl::Status EmbeddingBackward(Acc* dtable);
  // *loss = the mean cross-entropy over the B*T positions.
  absl::Status CrossEntropyForward(double* loss);
  absl::Status CrossEntropyBackward(double loss_scale);

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
  double cross_entropy_ = 0;
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
};

template <typename T>
using DecoderModel = DecoderModelT<Cpu<T>>;

// The registry's device rows (registry.cc), B = Cuda<float> or Cuda<__nv_bfloat16> in CUDA
// builds: this rank's model on the device for the designs instantiated there (the standard
// topology; value residual "none" or "resformer"; the dense FFN), its table aligned to 32
// (the GPU's, BuildParamTable(config, shard, 32)). Any other design: Unimplemented naming
// the config field and value (the GPU runs it through model/gpu/ for now); a config or
// sharding the CPU registry refuses: the CPU registry's error.
template <class B>
absl::StatusOr<std::unique_ptr<DecoderModelT<B>>> CreateDeviceModel(const ModelConfig& config,
                                                                   const Sharding& shard,
                                                                   const typename B::Exec& x);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_DECODER_H_
