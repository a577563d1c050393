// model/variants/depth_sources.h: the data flow that AttnRes (attnres.cc) and Transparent
// Attention (transparent.cc) share; they differ only in how a step mixes its sources.
//
// The state after sublayer l is a list of sources: h0, then one completed entry per finished
// block (every sublayer output in the full variant, block_size 1), and the open block's
// partial sum p when its block has begun. Step l (1..2L, then 2L + 1 the final readout) reads
//   u_l = mix_l(sources, p)                  (the design's: Derived::MixForward)
// and, for l <= 2L, the branch's y = f_l(u_l) makes the next partial p + y (y when p is empty);
// a block's last sublayer completes its partial into a new source. A pipeline boundary carries
// the completed sources and the partial (BoundaryTensors). The backward runs the steps in
// reverse with the gradients of the sources (dsources_) and of the partial (dpartial_), which
// the design's MixBackward adds to. Each step's depth weights (per token, or one row for the
// whole pass) are summed over their rows for the statistics (AppendStats: their means).
#ifndef SATDAR_MODEL_VARIANTS_DEPTH_SOURCES_H_
#define SATDAR_MODEL_VARIANTS_DEPTH_SOURCES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/backend.h"
#include "model/branches.h"
#include "model/config.h"
#include "model/ops.h"
#include "model/sharding.h"
#include "model/topology.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

// CRTP base of the two designs. Derived (which names this base a friend) provides:
//   static constexpr char kStatsKey[]        the depth weights' key in AppendStats' JSON
//   static constexpr bool kWeightsPerToken   Step::weights holds one row per token (rows,
//                                            sources), or one row for the whole pass
//   static constexpr double kInitialWeight   what Resize fills Step::weights with
//   absl::Status MixForward(const Weights<B>& w, int l, Step& s, T* u)
//       u (N, C) <- step l's mix of s's sources (PublishInputs); s.weights <- its weights
//   absl::Status MixBackward(const Weights<B>& w, Acc* grads, int l, const Step& s,
//                            const T* du)
//       the gradients of s's sources (PublishLists) and of step l's parameters += from du
//   void ResizeMix(int max_sources)          (optional) its own buffers, in Resize
// Step l is steps_[l - 1]; its sources are sources_[0, s.sources) and, when s.has_partial,
// s.partial.
template <class B, class Derived>
class DepthSourcesTopology : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  DepthSourcesTopology(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : sublayers_(2 * c.num_hidden_layers), block_(c.block_size > 0 ? c.block_size : 1),
        d_(c.hidden_size), x_(x), steps_(sublayers_ + 1),
        first_(2 * shard.first_layer(c) + 1), last_(2 * shard.end_layer(c)) {}

  absl::Status Resize(int rows) override {
    rows_ = rows;
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
      s.weights.assign(used ? static_cast<size_t>(WeightRows()) * max_sources : 0,
                       Acc(Derived::kInitialWeight));
    }
    derived().ResizeMix(max_sources);
    y_.resize(nc);
    dpartial_.resize(nc);
    du_.resize(nc);
    dy_.resize(nc);
    // The statistics' accumulators (sublayer, source), zero; once (their size does not depend
    // on rows, and what they gathered stays until ResetStats, with weight_rows_).
    stats_stride_ = max_sources;
    const size_t stats = static_cast<size_t>(sublayers_ + 1) * max_sources;
    if (weight_sum_.size() != stats) weight_sum_.assign(stats, 0.0);
    return absl::OkStatus();
  }

  // The state after sublayer l: the completed entries (h0, then one per finished block; every
  // sublayer output in the full variant) and the open block's partial sum.
  int BoundaryTensors(int l) const override {
    return 1 + l / block_ + (l % block_ != 0 ? 1 : 0);
  }

  absl::Status ForwardRange(const Weights<B>& w, int first, int last, const T* h0,
                            const std::vector<const T*>& in, BranchesT<B>* br, T* x_final,
                            const std::vector<T*>& out) override {
    const int64_t n = Elements();
    int m = 1 + (first - 1) / block_;        // completed sources
    bool has_p = (first - 1) % block_ != 0;  // partial sum non-empty
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
      SATDAR_RETURN_IF_ERROR(derived().MixForward(w, l, s, u));
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
    const int64_t n = Elements();
    for (auto& d : dsources_) {
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, d.data(), static_cast<int64_t>(d.size())));
    }
    SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dpartial_.data(), n));
    // Final readout (or the next stage's gradients of the state after `last`), then the
    // sublayers in reverse. dpartial_ is d/d(partial sum) at the point the current step read it.
    if (last == sublayers_) {
      SATDAR_RETURN_IF_ERROR(derived().MixBackward(w, grads, sublayers_ + 1, steps_[sublayers_],
                                                   dx_final));
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
      SATDAR_RETURN_IF_ERROR(derived().MixBackward(w, grads, l, s, du_.data()));
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
      int count = s.count();
      for (int i = 0; i < count; ++i) {
        const double total = sum != nullptr ? sum[l * stats_stride_ + i] : 0.0;
        w.push_back(total / std::max<int64_t>(weight_rows_, 1));
      }
      all.push_back(w);
    }
    // [sublayer 1..2L, final][source: embedding, blocks..., partial]: each depth weight's mean
    // over the rows since the last ResetStats (the tokens, or the passes of weights that are
    // one row a pass).
    (*stats)[Derived::kStatsKey] = all;
  }
  void SetStatsEnabled(bool on) override { stats_ = on; }
  void ResetStats() override {
    // A failed fill is the stream's error, which the next pass returns.
    (void)ops::Zero(x_, weight_sum_.data(), static_cast<int64_t>(weight_sum_.size()));
    weight_rows_ = 0;
  }

 protected:
  struct Step {
    int sources = 0;  // completed sources read: sources_[0, sources)
    bool has_partial = false;
    Vec<T> u, partial;
    // Its depth weights of the last forward, (WeightRows(), count()) of them written, in B::Acc
    // (fp32 on CUDA: the retrieval ops' and the master weights' type).
    Vec<Acc> weights;
    int count() const { return sources + (has_partial ? 1 : 0); }
  };

  // Sublayer l's parameters' prefix; index 0 is the final readout.
  static std::string Prefix(int l) {
    if (l == 0) return "model.final_res";
    return absl::StrCat("model.layers.", (l - 1) / 2, l % 2 == 1 ? ".attn_res" : ".mlp_res");
  }

  // Step l (1..2L+1, the last one the final readout) runs on this pipeline stage.
  bool Owned(int l) const {
    return (l >= first_ && l <= last_) || (l == sublayers_ + 1 && last_ == sublayers_);
  }
  // Elements of one (N, C) buffer.
  int64_t Elements() const { return static_cast<int64_t>(y_.size()); }
  // Rows of a step's depth weights: one per token, or one for the whole pass.
  int WeightRows() const { return Derived::kWeightsPerToken ? rows_ : 1; }

  // The step's sources as the list the mixing ops read (inputs_), published after every
  // change of entries; PublishLists also their gradients (grads_), first.
  absl::Status PublishInputs(const Step& s) {
    inputs_.clear();
    for (int i = 0; i < s.sources; ++i) inputs_.push_back(sources_[i]);
    if (s.has_partial) inputs_.push_back(s.partial.data());
    return inputs_.Publish(x_);
  }
  absl::Status PublishLists(const Step& s) {
    grads_.clear();
    for (int i = 0; i < s.sources; ++i) grads_.push_back(dsources_[i].data());
    if (s.has_partial) grads_.push_back(dpartial_.data());
    SATDAR_RETURN_IF_ERROR(grads_.Publish(x_));
    return PublishInputs(s);
  }

  // Default ResizeMix: no buffers of the design's own.
  void ResizeMix(int max_sources) { (void)max_sources; }

  const int sublayers_, block_, d_;
  const typename B::Exec x_;
  std::vector<Step> steps_;
  const int first_, last_;  // this stage's sublayers
  int rows_ = 0;
  Vec<T> h0_;
  std::vector<const T*> sources_;  // completed sources: h0_, or steps' partial buffers
  std::vector<Vec<T>> dsources_;
  Vec<T> y_, dpartial_, du_, dy_;
  // What the mixing ops read: a step's sources and their gradients.
  typename B::template PtrList<const T*> inputs_;
  typename B::template PtrList<T*> grads_;

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }

  absl::Status Accumulate(int index, const Step& s) {
    // Each source's weight summed over the rows, in B's memory (no wait for a device's
    // stream).
    SATDAR_RETURN_IF_ERROR(ops::AccumulateColumns(x_, weight_sum_.data() + index * stats_stride_,
                                                  nullptr, s.weights.data(), WeightRows(),
                                                  s.count()));
    // Once per pass, at this stage's first step (the last stage alone would leave the others'
    // statistics without a count).
    if (index == first_ - 1) weight_rows_ += WeightRows();
    return absl::OkStatus();
  }

  // (sublayer 1..2L and the final readout, source) in B's memory: each depth weight summed
  // over the rows since ResetStats; its host copy when read on a device.
  Vec<double> weight_sum_;
  mutable std::vector<double> host_sum_;
  int stats_stride_ = 0;     // sources per sublayer in weight_sum_
  int64_t weight_rows_ = 0;  // rows summed in weight_sum_: tokens, or passes
  bool stats_ = true;        // gather the depth weights' statistics (SetStatsEnabled)
};

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_DEPTH_SOURCES_H_
