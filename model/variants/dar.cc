#include "model/variants/dar.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/ops.h"
#include "model/variants/dar_ops.h"
#include "model/variants/depth_retrieval_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

template <class B>
class Dar : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  Dar(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : sublayers_(2 * c.num_hidden_layers), block_(c.block_size > 0 ? c.block_size : 2),
        d_(c.hidden_size), eps_(c.rms_norm_eps), x_(x), offsets_(sublayers_ + 1),
        steps_(sublayers_ + 1), first_(2 * shard.first_layer(c) + 1),
        last_(2 * shard.end_layer(c)) {
    route_ = DarRoute(c.dar_variant);  // (key stream, value stream) of target stream s
  }

  static std::string Prefix(int l) {
    if (l == 0) return "model.final_dar";
    return absl::StrCat("model.layers.", (l - 1) / 2, l % 2 == 1 ? ".attn_dar" : ".mlp_dar");
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)shard;
    if (place == ParamPlace::kFinal) AddRetrieval(Prefix(0), c.hidden_size, table);
    if (place != ParamPlace::kLayer) return;
    for (int l : {2 * i + 1, 2 * i + 2}) {
      const std::string p = Prefix(l);
      AddRetrieval(p, c.hidden_size, table);
      table->Add(p + ".transport", {1}, ParamInit::Constant(2.0));
      // +2 for the stream s == l % 2: attention (odd l) writes mainly to stream 1, MLP to 0.
      table->Add(p + ".write", {2},
                 ParamInit::Values({l % 2 == 0 ? 2.0 : -2.0, l % 2 == 1 ? 2.0 : -2.0}));
    }
  }
  void Bind(const ParamTable& table) override {
    for (int l = 1; l <= sublayers_ + 1; ++l) {
      if (!Owned(l)) continue;
      const std::string p = Prefix(l == sublayers_ + 1 ? 0 : l);
      Offsets& o = offsets_[l - 1];
      o.query = table.Offset(p + ".query");
      o.norm = table.Offset(p + ".norm.weight");
      o.mix = table.Offset(p + ".mix");
      if (l <= sublayers_) {
        o.transport = table.Offset(p + ".transport");
        o.write = table.Offset(p + ".write");
      }
    }
  }

  absl::Status Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_;
    const int max_sources = sublayers_ / block_ + 2;
    for (int s = 0; s < 2; ++s) {
      h0_[s].resize(nc);
      sources_[s].assign(max_sources, nullptr);
      dsources_[s].assign(max_sources, Vec<T>());  // B::Vec has no sized constructor
      for (auto& d : dsources_[s]) d.resize(nc);
      dpartial_[s].resize(nc);
    }
    // A pipeline stage keeps only the steps it runs (and the partial it imports).
    for (int k = 0; k <= sublayers_; ++k) {
      Step& st = steps_[k];
      const bool used = k + 1 >= first_ - 1 && (k + 1 <= last_ + 1 || Owned(sublayers_ + 1));
      const size_t size = used ? nc : 0;
      st.u.assign(size, T(0));
      st.y.assign(size, T(0));
      for (int s = 0; s < 2; ++s) {
        st.r[s].assign(size, T(0));
        st.partial[s].assign(size, T(0));
        st.alpha[s].assign(used ? static_cast<size_t>(rows) * max_sources : 0, Acc(0));
      }
    }
    du_.resize(nc);
    dy_.resize(nc);
    dr_[0].resize(nc);
    dr_[1].resize(nc);
    // The statistics' accumulators (sublayer, stream, source), zero; once (their size does not
    // depend on rows, and what they gathered stays until ResetStats, with tokens_).
    stats_stride_ = max_sources;
    const size_t stats = static_cast<size_t>(sublayers_ + 1) * 2 * max_sources;
    if (weight_sum_.size() != stats) weight_sum_.assign(stats, 0.0);
    return absl::OkStatus();
  }

  // The state after sublayer l: h0 (the first entry of both streams, sent once), each
  // stream's later completed block entries, and both partial sums inside an open block.
  int BoundaryTensors(int l) const override {
    return 1 + 2 * (l / block_) + (l % block_ != 0 ? 2 : 0);
  }

  // Analyses: the boundary's h0 is both streams' (-1), then each stream's entries and partial
  // (EntryIndex, PartialIndex); the depth states are each stream's history entries.
  int streams() const override { return 2; }
  int BoundaryStream(int l, int i) const override {
    const int m = 1 + l / block_;
    if (i == 0) return -1;
    if (i < 1 + 2 * (m - 1)) return (i - 1) / (m - 1);
    return i - (1 + 2 * (m - 1));
  }
  void DepthStates(std::vector<typename TopologyT<B>::DepthStateRef>* refs) const override {
    const int64_t nc = static_cast<int64_t>(rows_) * d_;
    for (int s = 0; s < 2; ++s) {
      for (int j = 0; j <= sublayers_ / block_; ++j) {
        refs->push_back({s, j, j * block_, sources_[s][j], nc, 0, d_});
      }
    }
  }

  absl::Status ForwardRange(const Weights<B>& w, int first, int last, const T* h0,
                            const std::vector<const T*>& in, BranchesT<B>* br, T* x_final,
                            const std::vector<T*>& out) override {
    const size_t nc = du_.size();
    const int64_t n = static_cast<int64_t>(nc);
    int m = 1 + (first - 1) / block_;
    bool has_p = (first - 1) % block_ != 0;
    if (first == 1) {
      for (int s = 0; s < 2; ++s) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, h0_[s].data(), h0, n));
        sources_[s][0] = h0_[s].data();
      }
    } else {
      // The previous stage's state (BoundaryTensors(first - 1) tensors), read in place.
      for (int s = 0; s < 2; ++s) {
        for (int j = 0; j < m; ++j) sources_[s][j] = in[EntryIndex(m, s, j)];
        if (has_p) {
          SATDAR_RETURN_IF_ERROR(
              ops::Copy(x_, steps_[first - 1].partial[s].data(), in[PartialIndex(m, s)], n));
        }
      }
    }
    const int end = last == sublayers_ ? sublayers_ + 1 : last;
    for (int l = first; l <= end; ++l) {
      // Step l reads the partials in st.partial, written there by step l-1's write.
      Step& st = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      st.sources = m;
      st.has_partial = has_p;
      // Retrieve r^s for both streams in one pass over the sources, then mix.
      SATDAR_RETURN_IF_ERROR(PublishInputs(st));
      T* const out[2] = {st.r[0].data(), st.r[1].data()};
      Acc* const alpha[2] = {st.alpha[0].data(), st.alpha[1].data()};
      SATDAR_RETURN_IF_ERROR(
          ops::DualDepthRetrievalForward(x_, out, alpha, Route(w, o), rows_, d_, eps_));
      T* u = l <= sublayers_ ? st.u.data() : x_final;
      SATDAR_RETURN_IF_ERROR(
          ops::DarMixForward(x_, u, st.r[0].data(), st.r[1].data(), w.master + o.mix, n));
      if (stats_) SATDAR_RETURN_IF_ERROR(Accumulate(l - 1, st));
      if (l > sublayers_) break;
      SATDAR_RETURN_IF_ERROR(br->Forward(l, u, st.y.data()));
      // Write: P0, P1 = rho P0 + (1-rho) P1 + b0 y, (1-rho) P0 + rho P1 + b1 y (empty P = 0),
      // straight into the next step's partials.
      SATDAR_RETURN_IF_ERROR(ops::DarWriteForward(
          x_, steps_[l].partial[0].data(), steps_[l].partial[1].data(),
          has_p ? st.partial[0].data() : nullptr, has_p ? st.partial[1].data() : nullptr,
          st.y.data(), w.master + o.transport, w.master + o.write, n));
      has_p = true;
      if (l % block_ == 0) {
        // The completed block's entries stay where they were written (the next step has no
        // partial, so nothing overwrites them).
        for (int s = 0; s < 2; ++s) sources_[s][m] = steps_[l].partial[s].data();
        ++m;
        has_p = false;
      }
    }
    if (last < sublayers_) {
      // Export the state after sublayer `last`.
      for (int s = 0; s < 2; ++s) {
        for (int j = s == 0 ? 0 : 1; j < m; ++j) {
          SATDAR_RETURN_IF_ERROR(ops::Copy(x_, out[EntryIndex(m, s, j)], sources_[s][j], n));
        }
        if (has_p) {
          const Vec<T>& p = steps_[last].partial[s];
          SATDAR_RETURN_IF_ERROR(ops::Copy(x_, out[PartialIndex(m, s)], p.data(),
                                           static_cast<int64_t>(p.size())));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status BackwardRange(const Weights<B>& w, Acc* grads, int first, int last,
                             const T* dx_final, const std::vector<const T*>& dout,
                             BranchesT<B>* br, T* dh0, const std::vector<T*>& din) override {
    const size_t nc = du_.size();
    const int64_t n = static_cast<int64_t>(nc);
    for (int s = 0; s < 2; ++s) {
      for (auto& d : dsources_[s]) {
        SATDAR_RETURN_IF_ERROR(ops::Zero(x_, d.data(), static_cast<int64_t>(d.size())));
      }
      SATDAR_RETURN_IF_ERROR(
          ops::Zero(x_, dpartial_[s].data(), static_cast<int64_t>(dpartial_[s].size())));
    }
    if (last == sublayers_) {
      SATDAR_RETURN_IF_ERROR(RetrievalAndMixBackward(sublayers_ + 1, w, grads, dx_final));
    } else {
      // The next stage's gradients of the state after `last`.
      const int m = 1 + last / block_;
      for (int s = 0; s < 2; ++s) {
        for (int j = s == 0 ? 0 : 1; j < m; ++j) {
          SATDAR_RETURN_IF_ERROR(
              ops::Copy(x_, dsources_[s][j].data(), dout[EntryIndex(m, s, j)], n));
        }
        if (last % block_ != 0) {
          SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dpartial_[s].data(), dout[PartialIndex(m, s)], n));
        }
      }
    }
    for (int l = last; l >= first; --l) {
      const Step& st = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      // d/d(partials after the write): a completed block's sources, or the running partials
      // (read and overwritten element by element below).
      const T* g0s = l % block_ == 0 ? dsources_[0][st.sources].data() : dpartial_[0].data();
      const T* g1s = l % block_ == 0 ? dsources_[1][st.sources].data() : dpartial_[1].data();
      const bool has_p = st.has_partial;
      SATDAR_RETURN_IF_ERROR(ops::DarWriteBackward(
          x_, dy_.data(), dpartial_[0].data(), dpartial_[1].data(), g0s, g1s, st.y.data(),
          has_p ? st.partial[0].data() : nullptr, has_p ? st.partial[1].data() : nullptr,
          w.master + o.transport, w.master + o.write, grads + o.transport, grads + o.write, n));
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, du_.data(), n));
      SATDAR_RETURN_IF_ERROR(br->Backward(l, st.u.data(), dy_.data(), du_.data()));
      SATDAR_RETURN_IF_ERROR(RetrievalAndMixBackward(l, w, grads, du_.data()));
    }
    // Both streams start from h0.
    T* dstart = first == 1 ? dh0 : din[0];
    SATDAR_RETURN_IF_ERROR(
        ops::Add(x_, dstart, dsources_[0][0].data(), dsources_[1][0].data(), n));
    if (first > 1) {
      const int m = 1 + (first - 1) / block_;
      for (int s = 0; s < 2; ++s) {
        for (int j = 1; j < m; ++j) {
          SATDAR_RETURN_IF_ERROR(ops::Copy(x_, din[EntryIndex(m, s, j)], dsources_[s][j].data(),
                                           static_cast<int64_t>(dsources_[s][j].size())));
        }
        if ((first - 1) % block_ != 0) {
          SATDAR_RETURN_IF_ERROR(ops::Copy(x_, din[PartialIndex(m, s)], dpartial_[s].data(),
                                           static_cast<int64_t>(dpartial_[s].size())));
        }
      }
    }
    return absl::OkStatus();
  }

  void AppendStats(nlohmann::json* stats) const override {
    nlohmann::json weights = nlohmann::json::array(), mix = nlohmann::json::array(),
                   transport = nlohmann::json::array(), write = nlohmann::json::array();
    bool last_params_ok = true;
    const double* sum = ReadStatistics<B>(x_, weight_sum_, &host_sum_);
    for (int l = 0; l <= sublayers_; ++l) {
      if (!Owned(l + 1)) continue;  // another pipeline stage's sublayer
      const Step& st = steps_[l];
      const int count = st.sources + (st.has_partial ? 1 : 0);
      nlohmann::json per_stream = nlohmann::json::array();
      for (int s = 0; s < 2; ++s) {
        nlohmann::json w = nlohmann::json::array();
        for (int i = 0; i < count; ++i) {
          const double total = sum != nullptr ? sum[(l * 2 + s) * stats_stride_ + i] : 0.0;
          w.push_back(total / std::max<int64_t>(tokens_, 1));
        }
        per_stream.push_back(w);
      }
      weights.push_back(per_stream);
      if (last_params_ == nullptr || !last_params_ok) continue;
      const Offsets& o = offsets_[l];
      // The scalars read back from the master weights (copies on the CPU); on a failed copy
      // the coefficients end here.
      Acc m[2], t[1], wr[2];
      if (!ops::Download(x_, m, last_params_ + o.mix, 2).ok()) {
        last_params_ok = false;
        continue;
      }
      double c0, c1;
      cpu::DarMixCoefficients(m, &c0, &c1);
      mix.push_back({c0, c1});
      if (l < sublayers_) {
        if (!ops::Download(x_, t, last_params_ + o.transport, 1).ok() ||
            !ops::Download(x_, wr, last_params_ + o.write, 2).ok()) {
          last_params_ok = false;
          continue;
        }
        double rho, b0, b1;
        cpu::DarWriteCoefficients(t, wr, &rho, &b0, &b1);
        transport.push_back(rho);
        write.push_back({b0, b1});
      }
    }
    // [sublayer 1..2L, final][stream][source]; mix [..][c0, c1]; write [..][beta0, beta1].
    (*stats)["dar_depth_weights"] = weights;
    (*stats)["dar_mix"] = mix;
    (*stats)["dar_transport"] = transport;
    (*stats)["dar_write"] = write;
  }
  void SetStatsEnabled(bool on) override { stats_ = on; }
  void ResetStats() override {
    // A failed fill is the stream's error, which the next pass returns.
    (void)ops::Zero(x_, weight_sum_.data(), static_cast<int64_t>(weight_sum_.size()));
    tokens_ = 0;
  }

 private:
  struct Offsets {
    int64_t query = -1, norm = -1, mix = -1, transport = -1, write = -1;
  };
  struct Step {
    int sources = 0;
    bool has_partial = false;
    Vec<T> u, y, r[2], partial[2];
    Vec<Acc> alpha[2];  // B::Acc (fp32 on CUDA, the retrieval ops' type)
  };

  static void AddRetrieval(const std::string& p, int64_t d, ParamTable* table) {
    table->Add(p + ".query", {2, d}, ParamInit::Constant(0.0));
    table->Add(p + ".norm.weight", {d}, ParamInit::Constant(1.0));
    table->Add(p + ".mix", {2}, ParamInit::Constant(0.0));
  }
  // The step's sources of each stream (and their gradients) as the lists the retrieval ops
  // read, published after every change of entries.
  absl::Status PublishInputs(const Step& st) {
    for (int t = 0; t < 2; ++t) {
      inputs_[t].clear();
      for (int i = 0; i < st.sources; ++i) inputs_[t].push_back(sources_[t][i]);
      if (st.has_partial) inputs_[t].push_back(st.partial[t].data());
      SATDAR_RETURN_IF_ERROR(inputs_[t].Publish(x_));
    }
    return absl::OkStatus();
  }
  absl::Status PublishGrads(const Step& st) {
    for (int t = 0; t < 2; ++t) {
      grads_[t].clear();
      for (int i = 0; i < st.sources; ++i) grads_[t].push_back(dsources_[t][i].data());
      if (st.has_partial) grads_[t].push_back(dpartial_[t].data());
      SATDAR_RETURN_IF_ERROR(grads_[t].Publish(x_));
    }
    return absl::OkStatus();
  }
  // du is d/du of the mixed retrieval u = c0 r0 + c1 r1 at step l.
  absl::Status RetrievalAndMixBackward(int l, const Weights<B>& w, Acc* grads, const T* du) {
    last_params_ = w.master;
    const Step& st = steps_[l - 1];
    const Offsets& o = offsets_[l - 1];
    SATDAR_RETURN_IF_ERROR(ops::DarMixBackward(x_, dr_[0].data(), dr_[1].data(), du,
                                               st.r[0].data(), st.r[1].data(), w.master + o.mix,
                                               grads + o.mix, static_cast<int64_t>(du_.size())));
    SATDAR_RETURN_IF_ERROR(PublishInputs(st));
    SATDAR_RETURN_IF_ERROR(PublishGrads(st));
    T* const* const dstreams[2] = {grads_[0].data(), grads_[1].data()};
    Acc* const dw[2] = {grads + o.query, grads + o.query + d_};
    const T* const dout[2] = {dr_[0].data(), dr_[1].data()};
    const Acc* const alpha[2] = {st.alpha[0].data(), st.alpha[1].data()};
    return ops::DualDepthRetrievalBackward(x_, dstreams, dw, grads + o.norm, dout, alpha,
                                           Route(w, o), rows_, d_, eps_);
  }
  // The retrieval of a step from the published inputs_ (PublishInputs), which must stay
  // unchanged during the call.
  DualRetrieval<T> Route(const Weights<B>& w, const Offsets& o) const {
    DualRetrieval<T> r;
    r.streams[0] = inputs_[0].data();
    r.streams[1] = inputs_[1].data();
    r.sources = static_cast<int>(inputs_[0].size());
    for (int s = 0; s < 2; ++s) {
      r.key[s] = route_[s][0];
      r.value[s] = route_[s][1];
      r.w[s] = w.compute + o.query + s * d_;
    }
    r.g = w.compute + o.norm;
    return r;
  }
  absl::Status Accumulate(int index, const Step& st) {
    const int count = st.sources + (st.has_partial ? 1 : 0);
    // Each stream's weight of each source summed over the tokens, in B's memory (no wait for
    // a device's stream).
    for (int s = 0; s < 2; ++s) {
      SATDAR_RETURN_IF_ERROR(ops::AccumulateColumns(
          x_, weight_sum_.data() + (index * 2 + s) * stats_stride_, nullptr,
          st.alpha[s].data(), rows_, count));
    }
    // Once per pass, at this stage's first retrieval (the last stage alone would leave the
    // others' statistics without a token count).
    if (index == first_ - 1) tokens_ += rows_;
    return absl::OkStatus();
  }

  // Step l (1..2L+1, the last one the final readout) runs on this pipeline stage.
  bool Owned(int l) const {
    return (l >= first_ && l <= last_) || (l == sublayers_ + 1 && last_ == sublayers_);
  }
  // Boundary tensor layout with m completed entries per stream: h0, stream 0's entries
  // 1..m-1, stream 1's entries 1..m-1, then the two partials.
  static int EntryIndex(int m, int s, int j) { return j == 0 ? 0 : 1 + s * (m - 1) + (j - 1); }
  static int PartialIndex(int m, int s) { return 1 + 2 * (m - 1) + s; }

  const int sublayers_, block_, d_;
  const double eps_;
  const typename B::Exec x_;
  std::array<std::array<int, 2>, 2> route_{};  // route_[s] = {key stream, value stream}
  std::vector<Offsets> offsets_;
  std::vector<Step> steps_;
  const int first_, last_;                     // this stage's sublayers
  int rows_ = 0;
  Vec<T> h0_[2];                               // each stream's first source
  std::vector<const T*> sources_[2];           // completed entries (h0_, or steps' partials)
  std::vector<Vec<T>> dsources_[2];
  Vec<T> dpartial_[2], du_, dy_, dr_[2];
  // What the retrieval ops read: a step's sources of each stream, and their gradients.
  typename B::template PtrList<const T*> inputs_[2];
  typename B::template PtrList<T*> grads_[2];
  // (sublayer 1..2L and the final readout, stream, source) in B's memory: each depth weight
  // summed over the tokens since ResetStats; its host copy when read on a device.
  Vec<double> weight_sum_;
  mutable std::vector<double> host_sum_;
  int stats_stride_ = 0;  // sources per (sublayer, stream) in weight_sum_
  int64_t tokens_ = 0;
  bool stats_ = true;  // gather the depth weights' statistics (SetStatsEnabled)
  const Acc* last_params_ = nullptr;  // the master weights of the last backward
};

}  // namespace

void AddDarParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                  ParamTable* table) {
  Dar<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeDar(const ModelConfig& config, const Sharding& shard,
                                      const typename B::Exec& x) {
  return std::make_unique<Dar<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeDar<Cpu<float>>(const ModelConfig&,
                                                                    const Sharding&,
                                                                    const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeDar<Cpu<double>>(const ModelConfig&,
                                                                      const Sharding&,
                                                                      const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeDar<Cuda<float>>(const ModelConfig&,
                                                                      const Sharding&,
                                                                      const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeDar<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
