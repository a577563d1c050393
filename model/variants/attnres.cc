#include "model/variants/attnres.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/variants/depth_retrieval_ops.h"

namespace satdar::model {

namespace {

template <typename T>
class AttnRes : public Topology<T> {
 public:
  AttnRes(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : sublayers_(2 * c.num_hidden_layers), block_(c.block_size > 0 ? c.block_size : 1),
        d_(c.hidden_size), eps_(c.rms_norm_eps), pool_(pool), query_(sublayers_ + 1, -1),
        norm_(sublayers_ + 1, -1), steps_(sublayers_ + 1), first_(2 * shard.first_layer(c) + 1),
        last_(2 * shard.end_layer(c)) {}

  // Sublayer l's parameters; index sublayers_ is the final readout.
  static std::string Prefix(int l) {
    if (l == 0) return "model.final_res";
    return absl::StrCat("model.layers.", (l - 1) / 2, l % 2 == 1 ? ".attn_res" : ".mlp_res");
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)shard;
    if (place == ParamPlace::kLayer) {
      for (int l : {2 * i + 1, 2 * i + 2}) AddRetrieval(Prefix(l), c.hidden_size, table);
    } else if (place == ParamPlace::kFinal) {
      AddRetrieval(Prefix(0), c.hidden_size, table);
    }
  }
  void Bind(const ParamTable& table) override {
    for (int l = 1; l <= sublayers_ + 1; ++l) {
      if (!Owned(l)) continue;
      std::string p = Prefix(l == sublayers_ + 1 ? 0 : l);
      query_[l - 1] = table.Offset(p + ".query");
      norm_[l - 1] = table.Offset(p + ".norm.weight");
    }
  }

  void Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_;
    const int max_sources = sublayers_ / block_ + 2;
    h0_.resize(nc);
    sources_.assign(max_sources, nullptr);
    dsources_.assign(max_sources, std::vector<T>(nc));
    // A pipeline stage keeps only the steps it runs (and the partial it imports).
    for (int k = 0; k <= sublayers_; ++k) {
      Step& s = steps_[k];
      const bool used = k + 1 >= first_ - 1 && (k + 1 <= last_ + 1 || Owned(sublayers_ + 1));
      s.u.assign(used ? nc : 0, T(0));
      s.partial.assign(used ? nc : 0, T(0));
      s.alpha.assign(used ? static_cast<size_t>(rows) * max_sources : 0, T(0));
    }
    y_.resize(nc);
    dpartial_.resize(nc);
    du_.resize(nc);
    dy_.resize(nc);
    weight_sum_.assign(sublayers_ + 1, std::vector<double>(max_sources, 0.0));
  }

  // The state after sublayer l: the completed entries (h0, then one per finished block; every
  // sublayer output in Full AttnRes) and the open block's partial sum.
  int BoundaryTensors(int l) const override {
    return 1 + l / block_ + (l % block_ != 0 ? 1 : 0);
  }

  void ForwardRange(const T* params, int first, int last, const T* h0,
                    const std::vector<const T*>& in, Branches<T>* br, T* x_final,
                    const std::vector<T*>& out) override {
    const size_t nc = y_.size();
    int m = 1 + (first - 1) / block_;          // completed sources
    bool has_p = (first - 1) % block_ != 0;    // partial sum non-empty
    if (first == 1) {
      std::copy(h0, h0 + nc, h0_.begin());
      sources_[0] = h0_.data();
    } else {
      for (int j = 0; j < m; ++j) sources_[j] = in[j];  // read in place
      if (has_p) std::copy(in[m], in[m] + nc, steps_[first - 1].partial.begin());
    }
    const int end = last == sublayers_ ? sublayers_ + 1 : last;
    for (int l = first; l <= end; ++l) {
      // Step l reads the partial sum in s.partial, written there by step l-1.
      Step& s = steps_[l - 1];
      s.sources = m;
      s.has_partial = has_p;
      T* u = l <= sublayers_ ? s.u.data() : x_final;
      std::vector<const T*> x = Inputs(s);
      cpu::DepthRetrievalForward(u, s.alpha.data(), x.data(), x.data(), static_cast<int>(x.size()),
                                 params + query_[l - 1], params + norm_[l - 1], rows_, d_, eps_,
                                 pool_);
      Accumulate(l - 1, s);
      if (l > sublayers_) break;
      br->Forward(l, u, y_.data());
      const T* p = s.partial.data();
      const T* y = y_.data();
      T* q = steps_[l].partial.data();
      pool_->ParallelFor(
          static_cast<int64_t>(nc),
          [&](int64_t e0, int64_t e1) {
            for (int64_t e = e0; e < e1; ++e) q[e] = has_p ? p[e] + y[e] : y[e];
          },
          4096);
      has_p = true;
      if (l % block_ == 0) {
        sources_[m++] = steps_[l].partial.data();  // the next step has no partial to overwrite it
        has_p = false;
      }
    }
    if (last < sublayers_) {
      for (int j = 0; j < m; ++j) std::copy(sources_[j], sources_[j] + nc, out[j]);
      if (has_p) std::copy(steps_[last].partial.begin(), steps_[last].partial.end(), out[m]);
    }
  }

  void BackwardRange(const T* params, T* grads, int first, int last, const T* dx_final,
                     const std::vector<const T*>& dout, Branches<T>* br, T* dh0,
                     const std::vector<T*>& din) override {
    const size_t nc = y_.size();
    for (auto& d : dsources_) std::fill(d.begin(), d.end(), T(0));
    std::fill(dpartial_.begin(), dpartial_.end(), T(0));
    // Final readout (or the next stage's gradients of the state after `last`), then the
    // sublayers in reverse. dpartial_ is d/d(partial sum) at the point the current step read it.
    if (last == sublayers_) {
      RetrievalBackward(sublayers_ + 1, params, grads, dx_final);
    } else {
      const int m = 1 + last / block_;
      for (int j = 0; j < m; ++j) std::copy(dout[j], dout[j] + nc, dsources_[j].begin());
      if (last % block_ != 0) std::copy(dout[m], dout[m] + nc, dpartial_.begin());
    }
    for (int l = last; l >= first; --l) {
      const Step& s = steps_[l - 1];
      // d/d(partial after this sublayer): a completed block's source, or the running partial.
      const T* dafter = l % block_ == 0 ? dsources_[s.sources].data() : dpartial_.data();
      std::copy(dafter, dafter + dy_.size(), dy_.begin());
      // partial_after = partial_before + y: both get the same gradient.
      if (s.has_partial) {
        std::copy(dy_.begin(), dy_.end(), dpartial_.begin());
      } else {
        std::fill(dpartial_.begin(), dpartial_.end(), T(0));
      }
      std::fill(du_.begin(), du_.end(), T(0));
      br->Backward(l, s.u.data(), dy_.data(), du_.data());
      RetrievalBackward(l, params, grads, du_.data());
    }
    if (first == 1) {
      std::copy(dsources_[0].begin(), dsources_[0].end(), dh0);
      return;
    }
    const int m = 1 + (first - 1) / block_;
    for (int j = 0; j < m; ++j) std::copy(dsources_[j].begin(), dsources_[j].end(), din[j]);
    if ((first - 1) % block_ != 0) std::copy(dpartial_.begin(), dpartial_.end(), din[m]);
  }

  void AppendStats(nlohmann::json* stats) const override {
    nlohmann::json all = nlohmann::json::array();
    for (int l = 0; l <= sublayers_; ++l) {
      if (!Owned(l + 1)) continue;  // another pipeline stage's sublayer
      nlohmann::json w = nlohmann::json::array();
      const Step& s = steps_[l];
      int count = s.sources + (s.has_partial ? 1 : 0);
      for (int i = 0; i < count; ++i) w.push_back(weight_sum_[l][i] / std::max<int64_t>(tokens_, 1));
      all.push_back(w);
    }
    // [sublayer 1..2L, final][source: embedding, blocks..., partial]
    (*stats)["attnres_depth_weights"] = all;
  }
  void ResetStats() override {
    for (auto& w : weight_sum_) std::fill(w.begin(), w.end(), 0.0);
    tokens_ = 0;
  }

 private:
  struct Step {
    int sources = 0;
    bool has_partial = false;
    std::vector<T> u, partial, alpha;
  };

  static void AddRetrieval(const std::string& prefix, int64_t d, ParamTable* table) {
    table->Add(prefix + ".query", {d}, ParamInit::Constant(0.0));
    table->Add(prefix + ".norm.weight", {d}, ParamInit::Constant(1.0));
  }
  std::vector<const T*> Inputs(const Step& s) const {
    std::vector<const T*> x;
    for (int i = 0; i < s.sources; ++i) x.push_back(sources_[i]);
    if (s.has_partial) x.push_back(s.partial.data());
    return x;
  }
  void RetrievalBackward(int l, const T* params, T* grads, const T* dout) {
    const Step& s = steps_[l - 1];
    std::vector<T*> dx;
    for (int i = 0; i < s.sources; ++i) dx.push_back(dsources_[i].data());
    if (s.has_partial) dx.push_back(dpartial_.data());
    const std::vector<const T*> x = Inputs(s);
    cpu::DepthRetrievalBackward(dx.data(), dx.data(), grads + query_[l - 1], grads + norm_[l - 1],
                                dout, s.alpha.data(), x.data(), x.data(),
                                static_cast<int>(x.size()), params + query_[l - 1],
                                params + norm_[l - 1], rows_, d_, eps_, pool_);
  }
  void Accumulate(int index, const Step& s) {
    const int count = s.sources + (s.has_partial ? 1 : 0);
    for (int r = 0; r < rows_; ++r) {
      for (int i = 0; i < count; ++i) weight_sum_[index][i] += s.alpha[r * count + i];
    }
    // Once per pass, at this stage's first retrieval (the last stage alone would leave the
    // others' statistics without a token count).
    if (index == first_ - 1) tokens_ += rows_;
  }

  // Step l (1..2L+1, the last one the final readout) runs on this pipeline stage.
  bool Owned(int l) const {
    return (l >= first_ && l <= last_) || (l == sublayers_ + 1 && last_ == sublayers_);
  }

  const int sublayers_, block_, d_;
  const double eps_;
  core::ThreadPool* pool_;
  std::vector<int64_t> query_, norm_;  // per sublayer 1..2L, then the final readout
  std::vector<Step> steps_;
  const int first_, last_;                // this stage's sublayers
  int rows_ = 0;
  std::vector<T> h0_;
  std::vector<const T*> sources_;  // completed sources: h0_, or steps' partial buffers
  std::vector<std::vector<T>> dsources_;
  std::vector<T> y_, dpartial_, du_, dy_;
  std::vector<std::vector<double>> weight_sum_;
  int64_t tokens_ = 0;
};

}  // namespace

void AddAttnResParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                      ParamTable* table) {
  AttnRes<float>::AddParams(config, shard, place, layer, table);
}

template <typename T>
std::unique_ptr<Topology<T>> MakeAttnRes(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<AttnRes<T>>(config, shard, pool);
}

template std::unique_ptr<Topology<float>> MakeAttnRes<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeAttnRes<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
