#include "model/variants/denseformer.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/variants/denseformer_ops.h"

namespace satdar::model {

namespace {

// X_0 = h0; block i maps Y_{i-1} (Y_{-1} = h0) to X_{i+1} with the baseline's internal
// residuals; Y_i = sum_{j <= i+1} alpha_{i,j} X_j feeds block i+1; x_final = Y_{L-1}.
template <typename T>
class DenseFormer : public Topology<T> {
 public:
  DenseFormer(const ModelConfig& c, core::ThreadPool* pool)
      : layers_(c.num_hidden_layers), d_(c.hidden_size), pool_(pool), offsets_(layers_) {}

  static std::string Name(int i) { return absl::StrCat("model.layers.", i, ".dwa.weight"); }
  void AddLayerParams(int i, ParamTable* table) override {
    std::vector<double> init(i + 2, 0.0);
    init[i + 1] = 1.0;  // starts as the baseline: Y_i = X_{i+1}
    table->Add(Name(i), {i + 2}, ParamInit::Values(init));
  }
  void Bind(const ParamTable& table) override {
    for (int i = 0; i < layers_; ++i) offsets_[i] = table.Offset(Name(i));
  }
  void Resize(int rows) override {
    const size_t nc = static_cast<size_t>(rows) * d_;
    x_.assign(layers_ + 1, std::vector<T>(nc));
    dx_.assign(layers_ + 1, std::vector<T>(nc));
    in_.assign(layers_, std::vector<T>(nc));
    mid_.assign(layers_, std::vector<T>(nc));
    y_.resize(nc);
    dy_.resize(nc);
    dmid_.resize(nc);
    dbranch_.resize(nc);
    xs_.clear();
    dxs_.clear();
    for (int j = 0; j <= layers_; ++j) {
      xs_.push_back(x_[j].data());
      dxs_.push_back(dx_[j].data());
    }
  }

  void Forward(const T* params, const T* h0, Branches<T>* br, T* x_final) override {
    const size_t nc = y_.size();
    std::copy(h0, h0 + nc, x_[0].begin());
    std::copy(h0, h0 + nc, in_[0].begin());
    for (int i = 0; i < layers_; ++i) {
      br->Forward(2 * i + 1, in_[i].data(), y_.data());
      for (size_t e = 0; e < nc; ++e) mid_[i][e] = in_[i][e] + y_[e];
      br->Forward(2 * i + 2, mid_[i].data(), y_.data());
      for (size_t e = 0; e < nc; ++e) x_[i + 1][e] = mid_[i][e] + y_[e];
      T* out = i + 1 < layers_ ? in_[i + 1].data() : x_final;
      cpu::DwaForward(out, xs_.data(), i + 2, params + offsets_[i], static_cast<int64_t>(nc));
    }
  }

  void Backward(const T* params, T* grads, const T* dx_final, Branches<T>* br, T* dh0) override {
    const size_t nc = y_.size();
    for (auto& d : dx_) std::fill(d.begin(), d.end(), T(0));
    std::copy(dx_final, dx_final + nc, dy_.begin());  // d/d Y_{L-1}
    for (int i = layers_ - 1; i >= 0; --i) {
      cpu::DwaBackward(dxs_.data(), grads + offsets_[i], dy_.data(), xs_.data(), i + 2,
                       params + offsets_[i], static_cast<int64_t>(nc));
      // X_{i+1} = mid + f_mlp(mid); mid = in + f_attn(in).
      std::copy(dx_[i + 1].begin(), dx_[i + 1].end(), dmid_.begin());
      br->Backward(2 * i + 2, mid_[i].data(), dx_[i + 1].data(), dmid_.data());
      std::copy(dmid_.begin(), dmid_.end(), dbranch_.begin());
      br->Backward(2 * i + 1, in_[i].data(), dbranch_.data(), dmid_.data());
      std::copy(dmid_.begin(), dmid_.end(), dy_.begin());  // d/d Y_{i-1}
    }
    for (size_t e = 0; e < nc; ++e) dh0[e] = dy_[e] + dx_[0][e];
  }

 private:
  const int layers_, d_;
  core::ThreadPool* pool_;
  std::vector<int64_t> offsets_;
  std::vector<std::vector<T>> x_, dx_, in_, mid_;
  std::vector<T> y_, dy_, dmid_, dbranch_;
  std::vector<const T*> xs_;  // x_[j].data(), the sources of the depth-weighted averages
  std::vector<T*> dxs_;       // dx_[j].data()
};

}  // namespace

template <typename T>
std::unique_ptr<Topology<T>> MakeDenseFormer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  (void)shard;  // replicated: this design cannot be split across pipeline stages
  return std::make_unique<DenseFormer<T>>(config, pool);
}

template std::unique_ptr<Topology<float>> MakeDenseFormer<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeDenseFormer<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
