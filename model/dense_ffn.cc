#include "model/dense_ffn.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "model/layers/mlp.h"

namespace satdar::model {

namespace {

template <typename T>
class DenseFfn : public Ffn<T> {
 public:
  DenseFfn(const ModelConfig& c, core::ThreadPool* pool)
      : c_(c), pool_(pool), offsets_(c.num_hidden_layers), acts_(c.num_hidden_layers) {}

  static std::string Name(int i, const char* p) {
    return absl::StrCat("model.layers.", i, ".mlp.", p, "_proj.weight");
  }
  void AddLayerParams(int i, ParamTable* table) override {
    const ParamInit normal = ParamInit::Normal(c_.initializer_range);
    table->Add(Name(i, "gate"), {c_.intermediate_size, c_.hidden_size}, normal);
    table->Add(Name(i, "up"), {c_.intermediate_size, c_.hidden_size}, normal);
    table->Add(Name(i, "down"), {c_.hidden_size, c_.intermediate_size}, normal);
  }
  void Bind(const ParamTable& table) override {
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      offsets_[i] = {table.Offset(Name(i, "gate")), table.Offset(Name(i, "up")),
                     table.Offset(Name(i, "down"))};
    }
  }
  void Resize(int b, int t) override {
    dims_ = MlpDims{b * t, c_.hidden_size, c_.intermediate_size};
    for (auto& a : acts_) a.Resize(dims_);
    scratch_.Resize(dims_);
  }
  double Forward(int i, const T* params, const T* z, T* out) override {
    MlpForward(out, &acts_[i], z, Weights(const_cast<T*>(params), i), dims_, pool_);
    return 0.0;
  }
  void Backward(int i, const T* params, T* grads, const T* z, const T* dout, T* dz,
                double loss_scale) override {
    (void)loss_scale;
    MlpBackward(dz, Weights(grads, i), dout, acts_[i], z, Weights(const_cast<T*>(params), i),
                dims_, &scratch_, pool_);
  }

 private:
  struct Offsets {
    int64_t gate, up, down;
  };
  MlpWeights<T> Weights(T* base, int i) const {
    return {base + offsets_[i].gate, base + offsets_[i].up, base + offsets_[i].down};
  }
  const ModelConfig c_;
  core::ThreadPool* pool_;
  std::vector<Offsets> offsets_;
  std::vector<MlpActs<T>> acts_;
  MlpScratch<T> scratch_;
  MlpDims dims_;
};

}  // namespace

template <typename T>
std::unique_ptr<Ffn<T>> MakeDenseFfn(const ModelConfig& config, core::ThreadPool* pool) {
  return std::make_unique<DenseFfn<T>>(config, pool);
}

template std::unique_ptr<Ffn<float>> MakeDenseFfn<float>(const ModelConfig&, core::ThreadPool*);
template std::unique_ptr<Ffn<double>> MakeDenseFfn<double>(const ModelConfig&, core::ThreadPool*);

}  // namespace satdar::model
