#include "model/variants/satformer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "model/variants/satformer_ops.h"

namespace satdar::model {

namespace {

template <typename T>
class Satformer : public ValueResidual<T> {
 public:
  // Under tensor parallelism each rank gates its own KV heads (its rows of W_alpha), which
  // meet its own heads of V and V1: no communication beyond the block's.
  Satformer(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : c_(c.hidden_size), nkv_(shard.TpCount(c.num_key_value_heads)), hs_(c.head_size()),
        layers_(c.num_hidden_layers), pool_(pool), offsets_(layers_, -1), alpha_(layers_),
        gate_sum_(layers_, std::vector<double>(nkv_, 0.0)),
        gate_zeros_(layers_, std::vector<int64_t>(nkv_, 0)), gate_count_(layers_, 0) {}

  static std::string Name(int i) {
    return absl::StrCat("model.layers.", i, ".self_attn.value_gate.weight");
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    if (place != ParamPlace::kLayer || i < 1) return;  // layer 0 only produces V1
    table->AddShard(Name(i), {c.num_key_value_heads, c.hidden_size},
                    ParamInit::Normal(c.initializer_range), 0, shard.tp_rank, shard.tp_size);
  }
  void Bind(const ParamTable& table) override {
    for (int i = 1; i < layers_; ++i) {
      const ParamSpec* spec = table.Find(Name(i));  // absent: another pipeline stage's layer
      offsets_[i] = spec == nullptr ? -1 : spec->offset;
    }
  }
  void Resize(int rows) override {
    rows_ = rows;
    for (auto& a : alpha_) a.resize(static_cast<size_t>(rows) * nkv_);
    dalpha_.resize(static_cast<size_t>(rows) * nkv_);
  }

  void Forward(int i, const T* params, const T* x, const T* v, const T* v1, T* vmix) override {
    T* alpha = alpha_[i].data();
    cpu::ValueGateForward(alpha, x, params + offsets_[i], rows_, nkv_, c_, pool_);
    const size_t n = static_cast<size_t>(rows_) * nkv_;
    if (ablation_ == GateAblation::kZero) {
      std::fill(alpha, alpha + n, T(0));
    } else if (ablation_ == GateAblation::kMean) {
      for (size_t j = 0; j < n; ++j) alpha[j] = static_cast<T>(MeanGate(i, j % nkv_));
    } else if (!recomputing_) {
      // Statistics of the live gates, for logging and for the mean ablation (a recomputed
      // forward has been counted already).
      for (size_t j = 0; j < n; ++j) {
        gate_sum_[i][j % nkv_] += alpha[j];
        gate_zeros_[i][j % nkv_] += alpha[j] == T(0);
      }
      gate_count_[i] += rows_;
    }
    cpu::ValueMixForward(vmix, alpha, v, v1, rows_, nkv_, hs_, pool_);
  }

  void Backward(int i, const T* params, T* grads, const T* x, const T* v, const T* v1,
                const T* dvmix, T* dx, T* dv, T* dv1) override {
    (void)v;
    cpu::ValueMixBackward(dv, dv1, dalpha_.data(), dvmix, v1, alpha_[i].data(), rows_, nkv_,
                          hs_, pool_);
    cpu::ValueGateBackward(dx, grads + offsets_[i], dalpha_.data(), x, params + offsets_[i],
                           rows_, nkv_, c_, pool_);
  }

  void SetRecomputing(bool on) override { recomputing_ = on; }
  void AppendStats(nlohmann::json* stats) const override {
    nlohmann::json mean = nlohmann::json::array(), zeros = nlohmann::json::array();
    for (int i = 1; i < layers_; ++i) {
      nlohmann::json m = nlohmann::json::array(), z = nlohmann::json::array();
      for (int j = 0; j < nkv_; ++j) {
        double count = static_cast<double>(std::max<int64_t>(gate_count_[i], 1));
        m.push_back(gate_sum_[i][j] / count);
        z.push_back(gate_zeros_[i][j] / count);
      }
      mean.push_back(m);
      zeros.push_back(z);
    }
    (*stats)["satformer_gate_mean"] = mean;         // [layer 2..L][kv head]
    (*stats)["satformer_gate_zero_fraction"] = zeros;
  }

  const T* gate_values(int i) const override { return i >= 1 ? alpha_[i].data() : nullptr; }

  void ResetStats() override {
    for (int i = 0; i < layers_; ++i) {
      std::fill(gate_sum_[i].begin(), gate_sum_[i].end(), 0.0);
      std::fill(gate_zeros_[i].begin(), gate_zeros_[i].end(), 0);
      gate_count_[i] = 0;
    }
  }

  bool SetGateAblation(GateAblation mode) override {
    if (mode == GateAblation::kMean) {
      // Freeze the means measured so far.
      frozen_mean_.assign(layers_, std::vector<double>(nkv_, 0.0));
      for (int i = 1; i < layers_; ++i) {
        for (int j = 0; j < nkv_; ++j) frozen_mean_[i][j] = MeanGate(i, j);
      }
    }
    ablation_ = mode;
    return true;
  }

 private:
  double MeanGate(int i, int j) const {
    if (ablation_ == GateAblation::kMean && !frozen_mean_.empty()) return frozen_mean_[i][j];
    return gate_count_[i] > 0 ? gate_sum_[i][j] / gate_count_[i] : 0.0;
  }

  const int c_, nkv_, hs_, layers_;
  core::ThreadPool* pool_;
  int rows_ = 0;
  std::vector<int64_t> offsets_;
  std::vector<std::vector<T>> alpha_;  // per layer (B*T, NKV), after ReLU
  std::vector<T> dalpha_;
  bool recomputing_ = false;
  std::vector<std::vector<double>> gate_sum_;
  std::vector<std::vector<int64_t>> gate_zeros_;
  std::vector<int64_t> gate_count_;
  GateAblation ablation_ = GateAblation::kNone;
  std::vector<std::vector<double>> frozen_mean_;
};

}  // namespace

void AddSatformerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                        int layer, ParamTable* table) {
  Satformer<float>::AddParams(config, shard, place, layer, table);
}

template <typename T>
std::unique_ptr<ValueResidual<T>> MakeSatformer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<Satformer<T>>(config, shard, pool);
}

template std::unique_ptr<ValueResidual<float>> MakeSatformer<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<ValueResidual<double>> MakeSatformer<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
