#include "model/variants/denseformer.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/ops.h"
#include "model/variants/denseformer_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

// X_0 = h0; block i maps Y_{i-1} (Y_{-1} = h0) to X_{i+1} with the baseline's internal
// residuals; Y_i = sum_{j <= i+1} alpha_{i,j} X_j feeds block i+1; x_final = Y_{L-1}.
template <class B>
class DenseFormer : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // A pipeline stage runs blocks [a_, b_) and keeps only their buffers; earlier X_j are
  // read in place from the previous stage's boundary.
  DenseFormer(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : layers_(c.num_hidden_layers), d_(c.hidden_size), x_exec_(x), offsets_(layers_),
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
  absl::Status Resize(int rows) override {
    const size_t nc = static_cast<size_t>(rows) * d_;
    x_.assign(layers_ + 1, Vec<T>());
    in_.assign(layers_ + 1, Vec<T>());
    mid_.assign(layers_, Vec<T>());
    for (int i = a_; i < b_; ++i) {
      x_[i + 1].resize(nc);
      in_[i].resize(nc);
      mid_[i].resize(nc);
    }
    if (a_ == 0) x_[0].resize(nc);
    if (b_ < layers_) in_[b_].resize(nc);
    dx_.assign(b_ + 1, Vec<T>());  // B::Vec has no sized constructor
    for (auto& d : dx_) d.resize(nc);
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
    xs_from_in_ = false;
    SATDAR_RETURN_IF_ERROR(xs_.Publish(x_exec_));
    SATDAR_RETURN_IF_ERROR(dxs_.Publish(x_exec_));
    return absl::OkStatus();
  }

  // After block k (sublayer 2k): X_0..X_k, every source a later average reads, and Y_{k-1},
  // the next block's input. Stages split at block boundaries only.
  int BoundaryTensors(int l) const override {
    SATDAR_CHECK(l % 2 == 0) << "DenseFormer splits between blocks, not after sublayer " << l;
    return l / 2 + 2;
  }

  absl::Status ForwardRange(const Weights<B>& w, int first, int last, const T* h0,
                            const std::vector<const T*>& in, BranchesT<B>* br, T* x_final,
                            const std::vector<T*>& out) override {
    const size_t nc = y_.size();
    const int64_t n = static_cast<int64_t>(nc);
    const int a = (first - 1) / 2, b = last / 2;
    if (a == 0) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, x_[0].data(), h0, n));
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, in_[0].data(), h0, n));
      if (xs_from_in_) {  // a whole model resumed from a state before (Model::ForwardFromState)
        for (int j = 0; j <= layers_; ++j) xs_[j] = x_[j].empty() ? nullptr : x_[j].data();
        SATDAR_RETURN_IF_ERROR(xs_.Publish(x_exec_));
        xs_from_in_ = false;
      }
    } else {
      for (int j = 0; j <= a; ++j) xs_[j] = in[j];  // read in place
      xs_from_in_ = true;
      SATDAR_RETURN_IF_ERROR(xs_.Publish(x_exec_));
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, in_[a].data(), in[a + 1], n));
    }
    for (int i = a; i < b; ++i) {
      SATDAR_RETURN_IF_ERROR(br->Forward(2 * i + 1, in_[i].data(), y_.data()));
      SATDAR_RETURN_IF_ERROR(ops::Add(x_exec_, mid_[i].data(), in_[i].data(), y_.data(), n));
      SATDAR_RETURN_IF_ERROR(br->Forward(2 * i + 2, mid_[i].data(), y_.data()));
      SATDAR_RETURN_IF_ERROR(ops::Add(x_exec_, x_[i + 1].data(), mid_[i].data(), y_.data(), n));
      T* y = i + 1 < layers_ ? in_[i + 1].data() : x_final;
      SATDAR_RETURN_IF_ERROR(
          ops::DwaForward(x_exec_, y, xs_.data(), i + 2, w.master + offsets_[i], n));
    }
    if (b < layers_) {
      for (int j = 0; j <= b; ++j) SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, out[j], xs_[j], n));
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, out[b + 1], in_[b].data(), n));
    }
    return absl::OkStatus();
  }

  absl::Status BackwardRange(const Weights<B>& w, Acc* grads, int first, int last,
                             const T* dx_final, const std::vector<const T*>& dout,
                             BranchesT<B>* br, T* dh0, const std::vector<T*>& din) override {
    const size_t nc = y_.size();
    const int64_t n = static_cast<int64_t>(nc);
    const int a = (first - 1) / 2, b = last / 2;
    for (auto& d : dx_) {
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_exec_, d.data(), static_cast<int64_t>(d.size())));
    }
    if (b == layers_) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, dy_.data(), dx_final, n));  // d/d Y_{L-1}
    } else {
      for (int j = 0; j <= b; ++j) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, dx_[j].data(), dout[j], n));
      }
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, dy_.data(), dout[b + 1], n));  // d/d Y_{b-1}
    }
    for (int i = b - 1; i >= a; --i) {
      SATDAR_RETURN_IF_ERROR(ops::DwaBackward(x_exec_, dxs_.data(), grads + offsets_[i],
                                              dy_.data(), xs_.data(), i + 2,
                                              w.master + offsets_[i], n));
      // X_{i+1} = mid + f_mlp(mid); mid = in + f_attn(in).
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, dmid_.data(), dx_[i + 1].data(), n));
      SATDAR_RETURN_IF_ERROR(br->Backward(2 * i + 2, mid_[i].data(), dx_[i + 1].data(),
                                          dmid_.data()));
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, dbranch_.data(), dmid_.data(), n));
      SATDAR_RETURN_IF_ERROR(br->Backward(2 * i + 1, in_[i].data(), dbranch_.data(),
                                          dmid_.data()));
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, dy_.data(), dmid_.data(), n));  // d/d Y_{i-1}
    }
    if (a == 0) return ops::Add(x_exec_, dh0, dy_.data(), dx_[0].data(), n);
    for (int j = 0; j <= a; ++j) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, din[j], dx_[j].data(), n));
    }
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_exec_, din[a + 1], dy_.data(), n));
    return absl::OkStatus();
  }

 private:
  const int layers_, d_;
  const typename B::Exec x_exec_;
  std::vector<int64_t> offsets_;
  const int a_, b_;  // this pipeline stage's blocks [a_, b_)
  // x_[j] = X_j, in_[i] = block i's input Y_{i-1} (in_[0] = h0), mid_[i] after its attention.
  std::vector<Vec<T>> x_, dx_, in_, mid_;
  Vec<T> y_, dy_, dmid_, dbranch_;
  // The sources of the depth-weighted averages (X_j) and their gradients (dx_[j].data()),
  // published after every change of entries.
  typename B::template PtrList<const T*> xs_;
  bool xs_from_in_ = false;  // xs_ points into a previous stage's state (ForwardRange's `in`)
  typename B::template PtrList<T*> dxs_;
};

}  // namespace

void AddDenseFormerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                          int layer, ParamTable* table) {
  DenseFormer<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeDenseFormer(const ModelConfig& config, const Sharding& shard,
                                              const typename B::Exec& x) {
  return std::make_unique<DenseFormer<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeDenseFormer<Cpu<float>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeDenseFormer<Cpu<double>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeDenseFormer<Cuda<float>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeDenseFormer<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
