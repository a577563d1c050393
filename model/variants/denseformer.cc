#include "model/variants/denseformer.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/variants/denseformer_ops.h"

namespace satdar::model {

namespace {

// X_0 = h0; block i maps Y_{i-1} (Y_{-1} = h0) to X_{i+1} with the baseline's internal
// residuals; Y_i = sum_{j <= i+1} alpha_{i,j} X_j feeds block i+1; x_final = Y_{L-1}.
template <typename T>
class DenseFormer : public Topology<T> {
 public:
  // A pipeline stage runs blocks [a_, b_) and keeps only their buffers; earlier X_j are
  // read in place from the previous stage's boundary.
  DenseFormer(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : layers_(c.num_hidden_layers), d_(c.hidden_size), pool_(pool), offsets_(layers_),
        a_(shard.first_layer(c)), b_(shard.end_layer(c)) {}

  static std::string Name(int i) { return absl::StrCat("model.layers.", i, ".dwa.weight"); }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)c, (void)shard;
    if (place != ParamPlace::kLayer) return;
    std::vector<double> init(i + 2, 0.0);
    init[i + 1] = 1.0;  // starts as the baseline: Y_i = X_{i+1}
    table->Add(Name(i), {i + 2}, ParamInit::Values(init));
  }
  void Bind(const ParamTable& table) override {
    for (int i = a_; i < b_; ++i) offsets_[i] = table.Offset(Name(i));
  }
  void Resize(int rows) override {
    const size_t nc = static_cast<size_t>(rows) * d_;
    x_.assign(layers_ + 1, std::vector<T>());
    in_.assign(layers_ + 1, std::vector<T>());
    mid_.assign(layers_, std::vector<T>());
    for (int i = a_; i < b_; ++i) {
      x_[i + 1].resize(nc);
      in_[i].resize(nc);
      mid_[i].resize(nc);
    }
    if (a_ == 0) x_[0].resize(nc);
    if (b_ < layers_) in_[b_].resize(nc);
    dx_.assign(b_ + 1, std::vector<T>(nc));
    y_.resize(nc);
    dy_.resize(nc);
    dmid_.resize(nc);
    dbranch_.resize(nc);
    xs_.assign(layers_ + 1, nullptr);
    dxs_.clear();
    for (int j = 0; j <= layers_; ++j) {
      if (!x_[j].empty()) xs_[j] = x_[j].data();
      if (j <= b_) dxs_.push_back(dx_[j].data());
    }
  }

  // After block k (sublayer 2k): X_0..X_k, every source a later average reads, and Y_{k-1},
  // the next block's input. Stages split at block boundaries only.
  int BoundaryTensors(int l) const override {
    SATDAR_CHECK(l % 2 == 0) << "DenseFormer splits between blocks, not after sublayer " << l;
    return l / 2 + 2;
  }

  void ForwardRange(const T* params, int first, int last, const T* h0,
                    const std::vector<const T*>& in, Branches<T>* br, T* x_final,
                    const std::vector<T*>& out) override {
    const size_t nc = y_.size();
    const int a = (first - 1) / 2, b = last / 2;
    if (a == 0) {
      std::copy(h0, h0 + nc, x_[0].begin());
      std::copy(h0, h0 + nc, in_[0].begin());
    } else {
      for (int j = 0; j <= a; ++j) xs_[j] = in[j];  // read in place
      std::copy(in[a + 1], in[a + 1] + nc, in_[a].begin());
    }
    for (int i = a; i < b; ++i) {
      br->Forward(2 * i + 1, in_[i].data(), y_.data());
      for (size_t e = 0; e < nc; ++e) mid_[i][e] = in_[i][e] + y_[e];
      br->Forward(2 * i + 2, mid_[i].data(), y_.data());
      for (size_t e = 0; e < nc; ++e) x_[i + 1][e] = mid_[i][e] + y_[e];
      T* y = i + 1 < layers_ ? in_[i + 1].data() : x_final;
      cpu::DwaForward(y, xs_.data(), i + 2, params + offsets_[i], static_cast<int64_t>(nc));
    }
    if (b < layers_) {
      for (int j = 0; j <= b; ++j) std::copy(xs_[j], xs_[j] + nc, out[j]);
      std::copy(in_[b].begin(), in_[b].end(), out[b + 1]);
    }
  }

  void BackwardRange(const T* params, T* grads, int first, int last, const T* dx_final,
                     const std::vector<const T*>& dout, Branches<T>* br, T* dh0,
                     const std::vector<T*>& din) override {
    const size_t nc = y_.size();
    const int a = (first - 1) / 2, b = last / 2;
    for (auto& d : dx_) std::fill(d.begin(), d.end(), T(0));
    if (b == layers_) {
      std::copy(dx_final, dx_final + nc, dy_.begin());  // d/d Y_{L-1}
    } else {
      for (int j = 0; j <= b; ++j) std::copy(dout[j], dout[j] + nc, dx_[j].begin());
      std::copy(dout[b + 1], dout[b + 1] + nc, dy_.begin());  // d/d Y_{b-1}
    }
    for (int i = b - 1; i >= a; --i) {
      cpu::DwaBackward(dxs_.data(), grads + offsets_[i], dy_.data(), xs_.data(), i + 2,
                       params + offsets_[i], static_cast<int64_t>(nc));
      // X_{i+1} = mid + f_mlp(mid); mid = in + f_attn(in).
      std::copy(dx_[i + 1].begin(), dx_[i + 1].end(), dmid_.begin());
      br->Backward(2 * i + 2, mid_[i].data(), dx_[i + 1].data(), dmid_.data());
      std::copy(dmid_.begin(), dmid_.end(), dbranch_.begin());
      br->Backward(2 * i + 1, in_[i].data(), dbranch_.data(), dmid_.data());
      std::copy(dmid_.begin(), dmid_.end(), dy_.begin());  // d/d Y_{i-1}
    }
    if (a == 0) {
      for (size_t e = 0; e < nc; ++e) dh0[e] = dy_[e] + dx_[0][e];
      return;
    }
    for (int j = 0; j <= a; ++j) std::copy(dx_[j].begin(), dx_[j].end(), din[j]);
    std::copy(dy_.begin(), dy_.end(), din[a + 1]);
  }

 private:
  const int layers_, d_;
  core::ThreadPool* pool_;
  std::vector<int64_t> offsets_;
  const int a_, b_;  // this pipeline stage's blocks [a_, b_)
  // x_[j] = X_j, in_[i] = block i's input Y_{i-1} (in_[0] = h0), mid_[i] after its attention.
  std::vector<std::vector<T>> x_, dx_, in_, mid_;
  std::vector<T> y_, dy_, dmid_, dbranch_;
  std::vector<const T*> xs_;  // the sources of the depth-weighted averages (X_j)
  std::vector<T*> dxs_;       // dx_[j].data()
};

}  // namespace

void AddDenseFormerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                          int layer, ParamTable* table) {
  DenseFormer<float>::AddParams(config, shard, place, layer, table);
}

template <typename T>
std::unique_ptr<Topology<T>> MakeDenseFormer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<DenseFormer<T>>(config, shard, pool);
}

template std::unique_ptr<Topology<float>> MakeDenseFormer<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeDenseFormer<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
