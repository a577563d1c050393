#include "model/variants/resformer.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace satdar::model {

namespace {

template <typename T>
class Resformer : public ValueResidual<T> {
 public:
  // Under tensor parallelism each rank mixes its own KV heads; the lambdas' gradients are
  // then partial sums over the TP group.
  Resformer(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : learnable_(c.resformer_mode == ResformerMode::kLearnablePlus), layers_(c.num_hidden_layers),
        width_(shard.TpCount(c.num_key_value_heads) * c.head_size()), partial_(shard.tp_size > 1),
        pool_(pool), lambda2_(layers_, -1) {}

  static std::string Lambda2(int i) { return absl::StrCat("model.layers.", i, ".self_attn.lambda2"); }

  void AddGlobalParams(ParamTable* table) override {
    if (!learnable_) return;
    table->Add("model.value_residual.lambda_scale", {1}, ParamInit::Constant(layers_))
        .tp_partial_grad = partial_;
    table->Add("model.value_residual.lambda_logits", {layers_ - 1}, ParamInit::Constant(0.0))
        .tp_partial_grad = partial_;
  }
  void AddLayerParams(int i, ParamTable* table) override {
    if (!learnable_) return;
    // Layer 0's lambda2 exists (as in the SATFormer repository) but is never read.
    table->Add(Lambda2(i), {1}, ParamInit::Constant(0.5), /*unused=*/i == 0).tp_partial_grad =
        partial_;
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
    T l1, l2;
    Lambdas(i, params, &l1, &l2);
    const int64_t n = static_cast<int64_t>(rows_) * width_;
    pool_->ParallelFor(
        n,
        [&](int64_t a, int64_t b) {
          for (int64_t e = a; e < b; ++e) vmix[e] = l1 * v1[e] + l2 * v[e];
        },
        4096);
  }

  void Backward(int i, const T* params, T* grads, const T* x, const T* v, const T* v1,
                const T* dvmix, T* dx, T* dv, T* dv1) override {
    (void)x, (void)dx;
    T l1, l2;
    Lambdas(i, params, &l1, &l2);
    const int64_t n = static_cast<int64_t>(rows_) * width_;
    double dl1 = 0, dl2 = 0;
    for (int64_t e = 0; e < n; ++e) {
      dl1 += static_cast<double>(v1[e]) * dvmix[e];
      dl2 += static_cast<double>(v[e]) * dvmix[e];
      dv[e] = l2 * dvmix[e];
      dv1[e] += l1 * dvmix[e];
    }
    if (!learnable_) return;
    grads[lambda2_[i]] += static_cast<T>(dl2);
    // l1_i = s p_{i-1}, p = softmax(q): ds += dl1 p_{i-1}; dq_k += s dl1 p_{i-1} (delta - p_k).
    std::vector<double> p = Softmax(params);
    const double s = params[scale_];
    const int j = i - 1;
    grads[scale_] += static_cast<T>(dl1 * p[j]);
    for (int k = 0; k < layers_ - 1; ++k) {
      grads[logits_ + k] += static_cast<T>(s * dl1 * p[j] * ((k == j ? 1.0 : 0.0) - p[k]));
    }
  }

  void AppendStats(nlohmann::json* stats) const override {
    if (last_params_ == nullptr) return;
    nlohmann::json l1 = nlohmann::json::array(), l2 = nlohmann::json::array();
    for (int i = 1; i < layers_; ++i) {
      T a, b;
      Lambdas(i, last_params_, &a, &b);
      l1.push_back(static_cast<double>(a));
      l2.push_back(static_cast<double>(b));
    }
    (*stats)["resformer_lambda1"] = l1;
    (*stats)["resformer_lambda2"] = l2;
  }

 private:
  std::vector<double> Softmax(const T* params) const {
    std::vector<double> p(layers_ - 1);
    double mx = params[logits_];
    for (int k = 1; k < layers_ - 1; ++k) mx = std::max<double>(mx, params[logits_ + k]);
    double sum = 0;
    for (int k = 0; k < layers_ - 1; ++k) sum += p[k] = std::exp(params[logits_ + k] - mx);
    for (double& x : p) x /= sum;
    return p;
  }
  void Lambdas(int i, const T* params, T* l1, T* l2) const {
    last_params_ = params;
    if (!learnable_) {
      *l1 = *l2 = T(0.5);
      return;
    }
    *l1 = static_cast<T>(params[scale_] * Softmax(params)[i - 1]);
    *l2 = params[lambda2_[i]];
  }

  const bool learnable_;
  const int layers_, width_;
  const bool partial_;
  core::ThreadPool* pool_;
  int rows_ = 0;
  int64_t scale_ = -1, logits_ = -1;
  std::vector<int64_t> lambda2_;
  mutable const T* last_params_ = nullptr;
};

}  // namespace

template <typename T>
std::unique_ptr<ValueResidual<T>> MakeResformer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<Resformer<T>>(config, shard, pool);
}

template std::unique_ptr<ValueResidual<float>> MakeResformer<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<ValueResidual<double>> MakeResformer<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
