#include "model/variants/resformer.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/ops.h"
#include "model/variants/resformer_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

template <class B>
class Resformer : public ValueResidualT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;

  // Under tensor parallelism each rank mixes its own KV heads; the lambdas' gradients are
  // then partial sums over the TP group. learnable_plus's scale and logits are on every
  // pipeline stage (the softmax spans all layers); each stage's gradient covers its layers,
  // and the trainer sums them over the stages.
  Resformer(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : learnable_(c.resformer_mode == ResformerMode::kLearnablePlus), layers_(c.num_hidden_layers),
        width_(shard.TpCount(c.num_key_value_heads) * c.head_size()), x_(x), lambda2_(layers_, -1) {}

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
  absl::Status Resize(int rows) override {
    rows_ = rows;
    return absl::OkStatus();
  }

  absl::Status Forward(int i, const Weights<B>& w, const T* x, const T* v, const T* v1,
                       T* vmix) override {
    (void)x;
    last_params_ = w.master;
    SATDAR_RETURN_IF_ERROR(ops::ResformerMixForward(x_, vmix, v1, v, Lambdas(i, w.master),
                                                    static_cast<int64_t>(rows_) * width_));
    return absl::OkStatus();
  }

  absl::Status Backward(int i, const Weights<B>& w, Acc* grads, const T* x, const T* v,
                        const T* v1, const T* dvmix, T* dx, T* dv, T* dv1) override {
    (void)x, (void)dx;
    last_params_ = w.master;
    const bool l = learnable_;
    SATDAR_RETURN_IF_ERROR(ops::ResformerMixBackward(
        x_, dv, dv1, dvmix, v1, v, Lambdas(i, w.master), l ? grads + scale_ : nullptr,
        l ? grads + logits_ : nullptr, l ? grads + lambda2_[i] : nullptr,
        static_cast<int64_t>(rows_) * width_));
    return absl::OkStatus();
  }

  void AppendStats(nlohmann::json* stats) const override {
    if (last_params_ == nullptr) return;
    // The learnable lambdas read back from the master weights (copies on the CPU); none on a
    // failed copy.
    std::vector<Acc> scale(learnable_ ? 1 : 0), logits(learnable_ ? layers_ - 1 : 0),
        lambda2(learnable_ ? layers_ : 0);
    if (learnable_) {
      const int64_t nl = static_cast<int64_t>(logits.size());
      if (!ops::Download(x_, scale.data(), last_params_ + scale_, 1).ok() ||
          !ops::Download(x_, logits.data(), last_params_ + logits_, nl).ok()) {
        return;
      }
      for (int i = 1; i < layers_; ++i) {
        if (lambda2_[i] < 0) continue;
        if (!ops::Download(x_, &lambda2[i], last_params_ + lambda2_[i], 1).ok()) return;
      }
    }
    nlohmann::json l1 = nlohmann::json::array(), l2 = nlohmann::json::array();
    for (int i = 1; i < layers_; ++i) {
      if (learnable_ && lambda2_[i] < 0) {  // another pipeline stage's layer
        l1.push_back(nullptr);
        l2.push_back(nullptr);
        continue;
      }
      ResformerLambdas<Acc> p;
      p.layer = i;
      p.layers = layers_;
      if (learnable_) {
        p.scale = scale.data();
        p.logits = logits.data();
        p.lambda2 = &lambda2[i];
      }
      double a, b;
      cpu::ResformerMix(p, &a, &b);
      l1.push_back(static_cast<double>(static_cast<Acc>(a)));
      l2.push_back(static_cast<double>(static_cast<Acc>(b)));
    }
    (*stats)["resformer_lambda1"] = l1;
    (*stats)["resformer_lambda2"] = l2;
  }

 private:
  ResformerLambdas<Acc> Lambdas(int i, const Acc* params) const {
    ResformerLambdas<Acc> p;
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
  const typename B::Exec x_;
  int rows_ = 0;
  int64_t scale_ = -1, logits_ = -1;
  std::vector<int64_t> lambda2_;
  const Acc* last_params_ = nullptr;  // the master weights of the last pass
};

}  // namespace

void AddResformerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                        int layer, ParamTable* table) {
  Resformer<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<ValueResidualT<B>> MakeResformer(const ModelConfig& config, const Sharding& shard,
                                                 const typename B::Exec& x) {
  return std::make_unique<Resformer<B>>(config, shard, x);
}

template std::unique_ptr<ValueResidualT<Cpu<float>>> MakeResformer<Cpu<float>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
template std::unique_ptr<ValueResidualT<Cpu<double>>> MakeResformer<Cpu<double>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<ValueResidualT<Cuda<float>>> MakeResformer<Cuda<float>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
template std::unique_ptr<ValueResidualT<Cuda<__nv_bfloat16>>> MakeResformer<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
