#include "model/dense_ffn.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/layers/mlp.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

template <class B>
class DenseFfn : public FfnT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;

  // Under tensor parallelism each rank holds F/tp rows of gate and up (column-parallel) and
  // the matching columns of down (row-parallel): its output is a partial sum. With
  // Recompute::kFull one set of activations moves into the layer that runs (the branches
  // re-run Forward right before Backward).
  DenseFfn(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : c_(c), shard_(shard), f_(shard.TpCount(c.intermediate_size)), x_(x),
        offsets_(c.num_hidden_layers), acts_(c.num_hidden_layers) {}

  static std::string Name(int i, const char* p) {
    return absl::StrCat("model.layers.", i, ".mlp.", p, "_proj.weight");
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    if (place != ParamPlace::kLayer) return;
    const ParamInit normal = ParamInit::Normal(c.initializer_range);
    const int r = shard.tp_rank, tp = shard.tp_size;
    const int64_t f = c.intermediate_size, d = c.hidden_size;
    table->AddShard(Name(i, "gate"), {f, d}, normal, 0, r, tp);
    table->AddShard(Name(i, "up"), {f, d}, normal, 0, r, tp);
    table->AddShard(Name(i, "down"), {d, f}, normal, 1, r, tp);
  }
  void Bind(const ParamTable& table) override {
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      if (!shard_.OwnsLayer(c_, i)) continue;
      offsets_[i] = {table.Offset(Name(i, "gate")), table.Offset(Name(i, "up")),
                     table.Offset(Name(i, "down"))};
    }
  }
  absl::Status Resize(int b, int t) override {
    dims_ = MlpDims{b * t, c_.hidden_size, f_};
    const bool full = shard_.recompute == Recompute::kFull;
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      acts_[i] = MlpActs<B>();
      if (shard_.OwnsLayer(c_, i) && !full) acts_[i].Resize(dims_);
    }
    shared_ = MlpActs<B>();
    if (full) shared_.Resize(dims_);
    scratch_.Resize(dims_);
    return absl::OkStatus();
  }
  bool tp_partial() const override { return shard_.tp_size > 1; }
  absl::StatusOr<double> Forward(int i, const Weights<B>& w, const T* z, T* out) override {
    Swap(i);
    const absl::Status status =
        MlpForward(x_, out, &acts_[i], z, MlpWeightsAt(const_cast<T*>(w.compute), i), dims_);
    Swap(i);
    SATDAR_RETURN_IF_ERROR(status);
    return 0.0;
  }
  absl::Status Backward(int i, const Weights<B>& w, Acc* grads, const T* z, const T* dout,
                        T* dz, double loss_scale) override {
    (void)loss_scale;
    Swap(i);
    const absl::Status status =
        MlpBackward(x_, dz, MlpWeightsAt(grads, i), dout, acts_[i], z,
                    MlpWeightsAt(const_cast<T*>(w.compute), i), dims_, &scratch_);
    Swap(i);
    return status;
  }

 private:
  // kFull: moves the shared activations into layer i, and back (the same swap).
  void Swap(int i) {
    if (shard_.recompute == Recompute::kFull) std::swap(acts_[i], shared_);
  }
  struct Offsets {
    int64_t gate, up, down;
  };
  template <typename U>
  MlpWeights<U> MlpWeightsAt(U* base, int i) const {
    return {base + offsets_[i].gate, base + offsets_[i].up, base + offsets_[i].down};
  }
  const ModelConfig c_;
  const Sharding shard_;
  const int f_;  // this rank's intermediate size
  const typename B::Exec x_;
  std::vector<Offsets> offsets_;
  std::vector<MlpActs<B>> acts_;
  MlpActs<B> shared_;  // kFull: the one set
  MlpScratch<B> scratch_;
  MlpDims dims_;
};

}  // namespace

void AddDenseFfnParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                       int layer, ParamTable* table) {
  DenseFfn<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<FfnT<B>> MakeDenseFfn(const ModelConfig& config, const Sharding& shard,
                                      const typename B::Exec& x) {
  return std::make_unique<DenseFfn<B>>(config, shard, x);
}

template std::unique_ptr<FfnT<Cpu<float>>> MakeDenseFfn<Cpu<float>>(const ModelConfig&,
                                                                    const Sharding&,
                                                                    const core::CpuExec&);
template std::unique_ptr<FfnT<Cpu<double>>> MakeDenseFfn<Cpu<double>>(const ModelConfig&,
                                                                      const Sharding&,
                                                                      const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<FfnT<Cuda<float>>> MakeDenseFfn<Cuda<float>>(const ModelConfig&,
                                                                      const Sharding&,
                                                                      const core::CudaExec&);
template std::unique_ptr<FfnT<Cuda<__nv_bfloat16>>> MakeDenseFfn<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
