#include "model/variants/transparent.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/ops.h"
#include "model/variants/denseformer_ops.h"
#include "model/variants/transparent_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

// The data flow of attnres.cc (sources: h0 and one completed entry per block; the open
// block's partial sum), with u = sum_i softmax(z_l)_i X_i: DenseFormer's weighted sum
// (denseformer_ops.h) over the softmax of the sublayer's logits (transparent_ops.h).
template <class B>
class Transparent : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  Transparent(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : sublayers_(2 * c.num_hidden_layers), block_(c.block_size > 0 ? c.block_size : 1),
        d_(c.hidden_size), x_(x), logits_(sublayers_ + 1, -1), steps_(sublayers_ + 1),
        first_(2 * shard.first_layer(c) + 1), last_(2 * shard.end_layer(c)) {}

  // Sublayer l's parameters; index 0 is the final readout.
  static std::string Prefix(int l) {
    if (l == 0) return "model.final_res";
    return absl::StrCat("model.layers.", (l - 1) / 2, l % 2 == 1 ? ".attn_res" : ".mlp_res");
  }
  // |X| at step l (1..2L, 2L + 1 the final readout): h0, the blocks completed before it, and
  // the partial sum when its block has begun.
  static int Sources(int l, int block) {
    return 1 + (l - 1) / block + ((l - 1) % block != 0 ? 1 : 0);
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)shard;
    const int block = c.block_size > 0 ? c.block_size : 1;
    if (place == ParamPlace::kLayer) {
      // Layer 0's attention reads h0 alone and has no logits.
      for (int l : {2 * i + 1, 2 * i + 2}) {
        if (l > 1) AddLogits(Prefix(l), Sources(l, block), table);
      }
    } else if (place == ParamPlace::kFinal) {
      AddLogits(Prefix(0), Sources(2 * c.num_hidden_layers + 1, block), table);
    }
  }
  void Bind(const ParamTable& table) override {
    for (int l = 2; l <= sublayers_ + 1; ++l) {
      if (!Owned(l)) continue;
      logits_[l - 1] = table.Offset(Prefix(l == sublayers_ + 1 ? 0 : l) + ".logits");
    }
  }

  absl::Status Resize(int rows) override {
    const size_t nc = static_cast<size_t>(rows) * d_;
    const int max_sources = sublayers_ / block_ + 2;
    h0_.resize(nc);
    sources_.assign(max_sources, nullptr);
    dsources_.assign(max_sources, Vec<T>());  // B::Vec has no sized constructor
    for (auto& d : dsources_) d.resize(nc);
    // A pipeline stage keeps only the steps it runs (and the partial it imports).
    for (int k = 0; k <= sublayers_; ++k) {
      Step& s = steps_[k];
      const bool used = k + 1 >= first_ - 1 && (k + 1 <= last_ + 1 || Owned(sublayers_ + 1));
      s.u.assign(used ? nc : 0, T(0));
      s.partial.assign(used ? nc : 0, T(0));
      // 1: the weight of h0 at the first sublayer, which has no logits (for the statistics).
      s.weights.assign(used ? max_sources : 0, Acc(1));
    }
    dweights_.assign(max_sources, Acc(0));
    y_.resize(nc);
    dpartial_.resize(nc);
    du_.resize(nc);
    dy_.resize(nc);
    // The statistics' accumulators (sublayer, source), zero; once (their size does not depend
    // on rows, and what they gathered stays until ResetStats, with passes_).
    stats_stride_ = max_sources;
    const size_t stats = static_cast<size_t>(sublayers_ + 1) * max_sources;
    if (weight_sum_.size() != stats) weight_sum_.assign(stats, 0.0);
    return absl::OkStatus();
  }

  // As AttnRes: the completed entries and the open block's partial sum.
  int BoundaryTensors(int l) const override {
    return 1 + l / block_ + (l % block_ != 0 ? 1 : 0);
  }

  absl::Status ForwardRange(const Weights<B>& w, int first, int last, const T* h0,
                            const std::vector<const T*>& in, BranchesT<B>* br, T* x_final,
                            const std::vector<T*>& out) override {
    const size_t nc = y_.size();
    const int64_t n = static_cast<int64_t>(nc);
    int m = 1 + (first - 1) / block_;          // completed sources
    bool has_p = (first - 1) % block_ != 0;    // partial sum non-empty
    if (first == 1) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, h0_.data(), h0, n));
      sources_[0] = h0_.data();
    } else {
      for (int j = 0; j < m; ++j) sources_[j] = in[j];  // read in place
      if (has_p) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, steps_[first - 1].partial.data(), in[m], n));
      }
    }
    const int end = last == sublayers_ ? sublayers_ + 1 : last;
    for (int l = first; l <= end; ++l) {
      // Step l reads the partial sum in s.partial, written there by step l-1.
      Step& s = steps_[l - 1];
      s.sources = m;
      s.has_partial = has_p;
      T* u = l <= sublayers_ ? s.u.data() : x_final;
      const int count = m + (has_p ? 1 : 0);
      if (count == 1) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, u, sources_[0], n));  // h0 as it is
      } else {
        SATDAR_RETURN_IF_ERROR(PublishInputs(s));
        SATDAR_RETURN_IF_ERROR(
            ops::DepthSoftmaxForward(x_, s.weights.data(), w.master + logits_[l - 1], count));
        SATDAR_RETURN_IF_ERROR(
            ops::DwaForward(x_, u, inputs_.data(), count, s.weights.data(), n));
      }
      if (stats_) SATDAR_RETURN_IF_ERROR(Accumulate(l - 1, s));
      if (l > sublayers_) break;
      SATDAR_RETURN_IF_ERROR(br->Forward(l, u, y_.data()));
      // The next partial: p + y, or y when the partial is empty.
      T* q = steps_[l].partial.data();
      if (has_p) {
        SATDAR_RETURN_IF_ERROR(ops::Add(x_, q, s.partial.data(), y_.data(), n));
      } else {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, q, y_.data(), n));
      }
      has_p = true;
      if (l % block_ == 0) {
        sources_[m++] = steps_[l].partial.data();  // the next step has no partial to overwrite it
        has_p = false;
      }
    }
    if (last < sublayers_) {
      for (int j = 0; j < m; ++j) SATDAR_RETURN_IF_ERROR(ops::Copy(x_, out[j], sources_[j], n));
      if (has_p) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, out[m], steps_[last].partial.data(),
                                         static_cast<int64_t>(steps_[last].partial.size())));
      }
    }
    return absl::OkStatus();
  }

  absl::Status BackwardRange(const Weights<B>& w, Acc* grads, int first, int last,
                             const T* dx_final, const std::vector<const T*>& dout,
                             BranchesT<B>* br, T* dh0, const std::vector<T*>& din) override {
    (void)w;  // the backward reads the softmax weights its forward kept
    const size_t nc = y_.size();
    const int64_t n = static_cast<int64_t>(nc);
    for (auto& d : dsources_) {
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, d.data(), static_cast<int64_t>(d.size())));
    }
    SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dpartial_.data(), n));
    // Final readout (or the next stage's gradients of the state after `last`), then the
    // sublayers in reverse. dpartial_ is d/d(partial sum) at the point the current step read it.
    if (last == sublayers_) {
      SATDAR_RETURN_IF_ERROR(MixBackward(sublayers_ + 1, grads, dx_final));
    } else {
      const int m = 1 + last / block_;
      for (int j = 0; j < m; ++j) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dsources_[j].data(), dout[j], n));
      }
      if (last % block_ != 0) SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dpartial_.data(), dout[m], n));
    }
    for (int l = last; l >= first; --l) {
      const Step& s = steps_[l - 1];
      // d/d(partial after this sublayer): a completed block's source, or the running partial.
      const T* dafter = l % block_ == 0 ? dsources_[s.sources].data() : dpartial_.data();
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dy_.data(), dafter, n));
      // partial_after = partial_before + y: both get the same gradient.
      if (s.has_partial) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dpartial_.data(), dy_.data(), n));
      } else {
        SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dpartial_.data(), n));
      }
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, du_.data(), n));
      SATDAR_RETURN_IF_ERROR(br->Backward(l, s.u.data(), dy_.data(), du_.data()));
      SATDAR_RETURN_IF_ERROR(MixBackward(l, grads, du_.data()));
    }
    if (first == 1) {
      return ops::Copy(x_, dh0, dsources_[0].data(), static_cast<int64_t>(dsources_[0].size()));
    }
    const int m = 1 + (first - 1) / block_;
    for (int j = 0; j < m; ++j) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, din[j], dsources_[j].data(),
                                       static_cast<int64_t>(dsources_[j].size())));
    }
    if ((first - 1) % block_ != 0) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, din[m], dpartial_.data(), n));
    }
    return absl::OkStatus();
  }

  void AppendStats(nlohmann::json* stats) const override {
    const double* sum = ReadStatistics<B>(x_, weight_sum_, &host_sum_);
    nlohmann::json all = nlohmann::json::array();
    for (int l = 0; l <= sublayers_; ++l) {
      if (!Owned(l + 1)) continue;  // another pipeline stage's sublayer
      nlohmann::json w = nlohmann::json::array();
      const Step& s = steps_[l];
      int count = s.sources + (s.has_partial ? 1 : 0);
      for (int i = 0; i < count; ++i) {
        const double total = sum != nullptr ? sum[l * stats_stride_ + i] : 0.0;
        w.push_back(total / std::max<int64_t>(passes_, 1));
      }
      all.push_back(w);
    }
    // [sublayer 1..2L, final][source: embedding, blocks..., partial]: softmax(z_l), the mean
    // over the passes since the last ResetStats (the weights change with every step).
    (*stats)["transparent_depth_weights"] = all;
  }
  void SetStatsEnabled(bool on) override { stats_ = on; }
  void ResetStats() override {
    // A failed fill is the stream's error, which the next pass returns.
    (void)ops::Zero(x_, weight_sum_.data(), static_cast<int64_t>(weight_sum_.size()));
    passes_ = 0;
  }

 private:
  struct Step {
    int sources = 0;
    bool has_partial = false;
    Vec<T> u, partial;
    Vec<Acc> weights;  // softmax(z_l) of the last forward, B::Acc (the master weights' type)
  };

  static void AddLogits(const std::string& prefix, int64_t count, ParamTable* table) {
    table->Add(prefix + ".logits", {count}, ParamInit::Constant(0.0));  // uniform at init
  }
  // The step's sources as the list the weighted-sum ops read, published after every change of
  // entries.
  absl::Status PublishInputs(const Step& s) {
    inputs_.clear();
    for (int i = 0; i < s.sources; ++i) inputs_.push_back(sources_[i]);
    if (s.has_partial) inputs_.push_back(s.partial.data());
    return inputs_.Publish(x_);
  }
  // d/d(sources) += a_i dout; d/dz_l by the softmax's backward of <X_i, dout>.
  absl::Status MixBackward(int l, Acc* grads, const T* dout) {
    const Step& s = steps_[l - 1];
    const int64_t n = static_cast<int64_t>(y_.size());
    const int count = s.sources + (s.has_partial ? 1 : 0);
    if (count == 1) return ops::AddTo(x_, dsources_[0].data(), dout, n);
    grads_.clear();
    for (int i = 0; i < s.sources; ++i) grads_.push_back(dsources_[i].data());
    if (s.has_partial) grads_.push_back(dpartial_.data());
    SATDAR_RETURN_IF_ERROR(grads_.Publish(x_));
    SATDAR_RETURN_IF_ERROR(PublishInputs(s));
    SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dweights_.data(), count));
    SATDAR_RETURN_IF_ERROR(ops::DwaBackward(x_, grads_.data(), dweights_.data(), dout,
                                            inputs_.data(), count, s.weights.data(), n));
    return ops::DepthSoftmaxBackward(x_, grads + logits_[l - 1], s.weights.data(),
                                     dweights_.data(), count);
  }
  absl::Status Accumulate(int index, const Step& s) {
    const int count = s.sources + (s.has_partial ? 1 : 0);
    SATDAR_RETURN_IF_ERROR(ops::AccumulateColumns(
        x_, weight_sum_.data() + index * stats_stride_, nullptr, s.weights.data(), 1, count));
    // Once per pass, at this stage's first step.
    if (index == first_ - 1) ++passes_;
    return absl::OkStatus();
  }

  // Step l (1..2L+1, the last one the final readout) runs on this pipeline stage.
  bool Owned(int l) const {
    return (l >= first_ && l <= last_) || (l == sublayers_ + 1 && last_ == sublayers_);
  }

  const int sublayers_, block_, d_;
  const typename B::Exec x_;
  std::vector<int64_t> logits_;  // per sublayer 2..2L, then the final readout
  std::vector<Step> steps_;
  const int first_, last_;  // this stage's sublayers
  Vec<T> h0_;
  std::vector<const T*> sources_;  // completed sources: h0_, or steps' partial buffers
  std::vector<Vec<T>> dsources_;
  Vec<T> y_, dpartial_, du_, dy_;
  Vec<Acc> dweights_;  // d/d softmax(z_l) of the step being differentiated
  // What the weighted-sum ops read: a step's sources and their gradients.
  typename B::template PtrList<const T*> inputs_;
  typename B::template PtrList<T*> grads_;
  // (sublayer 1..2L and the final readout, source) in B's memory: each depth weight summed
  // over the passes since ResetStats; its host copy when read on a device.
  Vec<double> weight_sum_;
  mutable std::vector<double> host_sum_;
  int stats_stride_ = 0;  // sources per sublayer in weight_sum_
  int64_t passes_ = 0;
  bool stats_ = true;  // gather the depth weights' statistics (SetStatsEnabled)
};

}  // namespace

void AddTransparentParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                          int layer, ParamTable* table) {
  Transparent<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeTransparent(const ModelConfig& config, const Sharding& shard,
                                              const typename B::Exec& x) {
  return std::make_unique<Transparent<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeTransparent<Cpu<float>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeTransparent<Cpu<double>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeTransparent<Cuda<float>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeTransparent<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
