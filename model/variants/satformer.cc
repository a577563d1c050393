#include "model/variants/satformer.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/ops.h"
#include "model/variants/satformer_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

template <class B>
class Satformer : public ValueResidualT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // Under tensor parallelism each rank gates its own KV heads (its rows of W_alpha), which
  // meet its own heads of V and V1: no communication beyond the block's.
  Satformer(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : c_(c.hidden_size), nkv_(shard.TpCount(c.num_key_value_heads)), hs_(c.head_size()),
        layers_(c.num_hidden_layers), x_(x), offsets_(layers_, -1), alpha_(layers_),
        gate_count_(layers_, 0) {}

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
  absl::Status Resize(int rows) override {
    rows_ = rows;
    for (auto& a : alpha_) a.resize(static_cast<size_t>(rows) * nkv_);
    dalpha_.resize(static_cast<size_t>(rows) * nkv_);
    // The host copy of one layer's gates (the mean ablation's upload); the CPU writes alpha_
    // in place.
    if (B::kDevice) host_alpha_.resize(static_cast<size_t>(rows) * nkv_);
    const size_t stats = static_cast<size_t>(layers_) * nkv_;
    // Once: the statistics' accumulators, zero (again after a failed allocation).
    if (gate_sum_.size() != stats || gate_zeros_.size() != stats) {
      gate_sum_.assign(stats, 0.0);
      gate_zeros_.assign(stats, 0.0);
    }
    return absl::OkStatus();
  }

  absl::Status Forward(int i, const Weights<B>& w, const T* x, const T* v, const T* v1,
                       T* vmix) override {
    Acc* alpha = alpha_[i].data();
    SATDAR_RETURN_IF_ERROR(
        ops::ValueGateForward(x_, alpha, x, w.compute + offsets_[i], rows_, nkv_, c_));
    const size_t n = static_cast<size_t>(rows_) * nkv_;
    if (ablation_ == GateAblation::kZero) {
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, alpha, static_cast<int64_t>(n)));
    } else if (ablation_ == GateAblation::kMean) {
      // The ablation's frozen means, written on the host: in place on the CPU, into the host
      // copy and uploaded on a device.
      Acc* h = B::kDevice ? host_alpha_.data() : alpha;
      for (size_t j = 0; j < n; ++j) h[j] = static_cast<Acc>(MeanGate(i, j % nkv_));
      if (B::kDevice) {
        SATDAR_RETURN_IF_ERROR(ops::Upload(x_, alpha, h, static_cast<int64_t>(n)));
      }
    } else if (!recomputing_ && stats_) {
      // Statistics of the live gates, for logging and for the mean ablation (a recomputed
      // forward has been counted already): per KV head, the sum and the count of exact zeros,
      // accumulated in B's memory (no wait for a device's stream).
      SATDAR_RETURN_IF_ERROR(ops::AccumulateColumns(x_, gate_sum_.data() + i * nkv_,
                                                    gate_zeros_.data() + i * nkv_, alpha, rows_,
                                                    nkv_));
      gate_count_[i] += rows_;
    }
    SATDAR_RETURN_IF_ERROR(ops::ValueMixForward(x_, vmix, alpha, v, v1, rows_, nkv_, hs_));
    return absl::OkStatus();
  }

  absl::Status Backward(int i, const Weights<B>& w, Acc* grads, const T* x, const T* v,
                        const T* v1, const T* dvmix, T* dx, T* dv, T* dv1) override {
    (void)v;
    SATDAR_RETURN_IF_ERROR(ops::ValueMixBackward(x_, dv, dv1, dalpha_.data(), dvmix, v1,
                                                 alpha_[i].data(), rows_, nkv_, hs_));
    SATDAR_RETURN_IF_ERROR(ops::ValueGateBackward(x_, dx, grads + offsets_[i], dalpha_.data(),
                                                  x, w.compute + offsets_[i], rows_, nkv_, c_));
    return absl::OkStatus();
  }

  void SetRecomputing(bool on) override { recomputing_ = on; }
  void SetStatsEnabled(bool on) override { stats_ = on; }
  void AppendStats(nlohmann::json* stats) const override {
    const double* sum = ReadStatistics<B>(x_, gate_sum_, &host_sum_);
    const double* zero = ReadStatistics<B>(x_, gate_zeros_, &host_zeros_);
    nlohmann::json mean = nlohmann::json::array(), zeros = nlohmann::json::array();
    for (int i = 1; i < layers_; ++i) {
      nlohmann::json m = nlohmann::json::array(), z = nlohmann::json::array();
      for (int j = 0; j < nkv_; ++j) {
        double count = static_cast<double>(std::max<int64_t>(gate_count_[i], 1));
        m.push_back(sum != nullptr ? sum[i * nkv_ + j] / count : 0.0);
        z.push_back(zero != nullptr ? zero[i * nkv_ + j] / count : 0.0);
      }
      mean.push_back(m);
      zeros.push_back(z);
    }
    (*stats)["satformer_gate_mean"] = mean;         // [layer 2..L][kv head]
    (*stats)["satformer_gate_zero_fraction"] = zeros;
  }

  // The gates are B::Acc (fp32 on CUDA, the ops' type).
  const Acc* gate_values(int i) const override { return i >= 1 ? alpha_[i].data() : nullptr; }

  void ResetStats() override {
    // A failed fill is the stream's error, which the next pass returns.
    (void)ops::Zero(x_, gate_sum_.data(), static_cast<int64_t>(gate_sum_.size()));
    (void)ops::Zero(x_, gate_zeros_.data(), static_cast<int64_t>(gate_zeros_.size()));
    std::fill(gate_count_.begin(), gate_count_.end(), 0);
  }

  bool SetGateAblation(GateAblation mode) override {
    if (mode == GateAblation::kMean) {
      // Freeze the means measured so far (on a device whose copy failed, zeros: the stream's
      // error, which the next pass returns).
      const double* sum = ReadStatistics<B>(x_, gate_sum_, &host_sum_);
      frozen_mean_.assign(layers_, std::vector<double>(nkv_, 0.0));
      for (int i = 1; i < layers_; ++i) {
        for (int j = 0; j < nkv_; ++j) {
          frozen_mean_[i][j] =
              sum != nullptr && gate_count_[i] > 0 ? sum[i * nkv_ + j] / gate_count_[i] : 0.0;
        }
      }
    }
    ablation_ = mode;
    return true;
  }

 private:
  // The mean ablation's gate of layer i, KV head j (frozen by SetGateAblation).
  double MeanGate(int i, int j) const { return frozen_mean_[i][j]; }

  const int c_, nkv_, hs_, layers_;
  const typename B::Exec x_;
  int rows_ = 0;
  std::vector<int64_t> offsets_;
  std::vector<Vec<Acc>> alpha_;  // per layer (B*T, NKV), after ReLU
  Vec<Acc> dalpha_;
  std::vector<Acc> host_alpha_;  // a device's gates of one layer on the host (empty on the CPU)
  bool recomputing_ = false;
  bool stats_ = true;  // gather the gates' statistics (SetStatsEnabled)
  // Per layer and KV head (layers, NKV), in B's memory: the gates' sum and count of zeros
  // since ResetStats, and their host copies when read on a device.
  Vec<double> gate_sum_, gate_zeros_;
  mutable std::vector<double> host_sum_, host_zeros_;
  std::vector<int64_t> gate_count_;
  GateAblation ablation_ = GateAblation::kNone;
  std::vector<std::vector<double>> frozen_mean_;
};

}  // namespace

void AddSatformerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                        int layer, ParamTable* table) {
  Satformer<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<ValueResidualT<B>> MakeSatformer(const ModelConfig& config, const Sharding& shard,
                                                 const typename B::Exec& x) {
  return std::make_unique<Satformer<B>>(config, shard, x);
}

template std::unique_ptr<ValueResidualT<Cpu<float>>> MakeSatformer<Cpu<float>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
template std::unique_ptr<ValueResidualT<Cpu<double>>> MakeSatformer<Cpu<double>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<ValueResidualT<Cuda<float>>> MakeSatformer<Cuda<float>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
template std::unique_ptr<ValueResidualT<Cuda<__nv_bfloat16>>> MakeSatformer<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
