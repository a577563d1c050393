#include "model/variants/resformer.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "model/variants/resformer_ops.h"

namespace satdar::model {

namespace {

template <typename T>
class Resformer : public ValueResidual<T> {
 public:
  // Under tensor parallelism each rank mixes its own KV heads; the lambdas' gradients are
  // then partial sums over the TP group. learnable_plus's scale and logits are on every
  // pipeline stage (the softmax spans all layers); each stage's gradient covers its layers,
  // and the trainer sums them over the stages.
  Resformer(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : learnable_(c.resformer_mode == ResformerMode::kLearnablePlus), layers_(c.num_hidden_layers),
        width_(shard.TpCount(c.num_key_value_heads) * c.head_size()), pool_(pool), lambda2_(layers_, -1) {}

  static std::string Lambda2(int i) { return absl::StrCat("model.layers.", i, ".self_attn.lambda2"); }

  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    if (c.resformer_mode != ResformerMode::kLearnablePlus) return;
    const bool partial = shard.tp_size > 1, stages = shard.pp_size > 1;
    const int layers = c.num_hidden_layers;
    if (place == ParamPlace::kGlobal) {
      ParamSpec& scale =
          table->Add("model.value_residual.lambda_scale", {1}, ParamInit::Constant(layers));
      scale.tp_partial_grad = partial;
      scale.pp_partial_grad = stages;
      ParamSpec& logits =
          table->Add("model.value_residual.lambda_logits", {layers - 1}, ParamInit::Constant(0.0));
      logits.tp_partial_grad = partial;
      logits.pp_partial_grad = stages;
    } else if (place == ParamPlace::kLayer) {
      // Layer 0's lambda2 exists (as in the SATFormer repository) but is never read.
      table->Add(Lambda2(i), {1}, ParamInit::Constant(0.5), /*unused=*/i == 0).tp_partial_grad =
          partial;
    }
  }
  void Bind(const ParamTable& table) override {
    if (!learnable_) return;
    scale_ = table.Offset("model.value_residual.lambda_scale");
    logits_ = table.Offset("model.value_residual.lambda_logits");
    for (int i = 0; i < layers_; ++i) {
      const ParamSpec* spec = table.Find(Lambda2(i));  // absent: another stage's layer
      lambda2_[i] = spec == nullptr ? -1 : spec->offset;
    }
  }
  void Resize(int rows) override { rows_ = rows; }

  void Forward(int i, const T* params, const T* x, const T* v, const T* v1, T* vmix) override {
    (void)x;
    last_params_ = params;
    cpu::ResformerMixForward(vmix, v1, v, Lambdas(i, params),
                             static_cast<int64_t>(rows_) * width_, pool_);
  }

  void Backward(int i, const T* params, T* grads, const T* x, const T* v, const T* v1,
                const T* dvmix, T* dx, T* dv, T* dv1) override {
    (void)x, (void)dx;
    last_params_ = params;
    const bool l = learnable_;
    cpu::ResformerMixBackward(dv, dv1, dvmix, v1, v, Lambdas(i, params),
                              l ? grads + scale_ : nullptr, l ? grads + logits_ : nullptr,
                              l ? grads + lambda2_[i] : nullptr,
                              static_cast<int64_t>(rows_) * width_);
  }

  void AppendStats(nlohmann::json* stats) const override {
    if (last_params_ == nullptr) return;
    nlohmann::json l1 = nlohmann::json::array(), l2 = nlohmann::json::array();
    for (int i = 1; i < layers_; ++i) {
      if (learnable_ && lambda2_[i] < 0) {  // another pipeline stage's layer
        l1.push_back(nullptr);
        l2.push_back(nullptr);
        continue;
      }
      double a, b;
      cpu::ResformerMix(Lambdas(i, last_params_), &a, &b);
      l1.push_back(static_cast<double>(static_cast<T>(a)));
      l2.push_back(static_cast<double>(static_cast<T>(b)));
    }
    (*stats)["resformer_lambda1"] = l1;
    (*stats)["resformer_lambda2"] = l2;
  }

 private:
  ResformerLambdas<T> Lambdas(int i, const T* params) const {
    ResformerLambdas<T> p;
    p.layer = i;
    p.layers = layers_;
    if (learnable_) {
      p.scale = params + scale_;
      p.logits = params + logits_;
      p.lambda2 = params + lambda2_[i];
    }
    return p;
  }

  const bool learnable_;
  const int layers_, width_;
  core::ThreadPool* pool_;
  int rows_ = 0;
  int64_t scale_ = -1, logits_ = -1;
  std::vector<int64_t> lambda2_;
  const T* last_params_ = nullptr;
};

}  // namespace

void AddResformerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                        int layer, ParamTable* table) {
  Resformer<float>::AddParams(config, shard, place, layer, table);
}

template <typename T>
std::unique_ptr<ValueResidual<T>> MakeResformer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<Resformer<T>>(config, shard, pool);
}

template std::unique_ptr<ValueResidual<float>> MakeResformer<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<ValueResidual<double>> MakeResformer<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
