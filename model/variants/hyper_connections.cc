#include "model/variants/hyper_connections.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/layers/linear.h"
#include "model/ops.h"
#include "model/variants/hyper_ops.h"
#include "model/variants/hyper_streams.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

// Every token carries n streams, stored interleaved as (B*T, n*C): row r, stream j is
// H + (r*n + j)*C, so the per-stream RMSNorm and projections run over B*T*n rows. The
// statistics and coefficients (rstd, the projections ta and tb, coef and its gradient) are
// B::Acc, as the ops take them (fp32 on CUDA; T on the CPU, where Acc == T).
template <class B>
class HyperConnections : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // A pipeline stage keeps its own sublayers' steps; its boundary carries the n streams.
  HyperConnections(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : sublayers_(2 * c.num_hidden_layers), n_(c.hc_streams), d_(c.hidden_size),
        eps_(c.rms_norm_eps), x_(x), offsets_(sublayers_), steps_(sublayers_),
        first_(2 * shard.first_layer(c) + 1), last_(2 * shard.end_layer(c)) {}

  static std::string Prefix(int l) {
    return absl::StrCat("model.layers.", (l - 1) / 2, l % 2 == 1 ? ".attn_hc" : ".mlp_hc");
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)shard;
    if (place != ParamPlace::kLayer) return;
    const int n = c.hc_streams;
    const int64_t d = c.hidden_size;
    for (int l : {2 * i + 1, 2 * i + 2}) {
      const std::string p = Prefix(l);
      const int k = l - 1;  // 0-based sublayer index
      std::vector<double> alpha(n * (n + 1), 0.0);
      for (int j = 0; j < n; ++j) {
        alpha[j * (n + 1)] = j == k % n ? 1.0 : 0.0;  // A_m = e_{k mod n}
        alpha[j * (n + 1) + 1 + j] = 1.0;              // A_r = I
      }
      table->Add(p + ".norm.weight", {d}, ParamInit::Constant(1.0));
      table->Add(p + ".static_alpha", {n, n + 1}, ParamInit::Values(alpha));
      table->Add(p + ".static_beta", {n}, ParamInit::Constant(1.0));
      table->Add(p + ".dynamic_alpha", {n + 1, d}, ParamInit::Constant(0.0));
      table->Add(p + ".dynamic_beta", {1, d}, ParamInit::Constant(0.0));
      table->Add(p + ".alpha_scale", {1}, ParamInit::Constant(0.01));
      table->Add(p + ".beta_scale", {1}, ParamInit::Constant(0.01));
    }
  }
  void Bind(const ParamTable& table) override {
    for (int l = first_; l <= last_; ++l) {
      const std::string p = Prefix(l);
      Offsets& o = offsets_[l - 1];
      o.norm = table.Offset(p + ".norm.weight");
      o.static_alpha = table.Offset(p + ".static_alpha");
      o.static_beta = table.Offset(p + ".static_beta");
      o.dynamic_alpha = table.Offset(p + ".dynamic_alpha");
      o.dynamic_beta = table.Offset(p + ".dynamic_beta");
      o.alpha_scale = table.Offset(p + ".alpha_scale");
      o.beta_scale = table.Offset(p + ".beta_scale");
    }
  }

  absl::Status Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_, hc = nc * n_;
    hyper_.assign(sublayers_ + 1, Vec<T>());
    for (int l = first_ - 1; l <= last_; ++l) hyper_[l].resize(hc);
    for (int l = first_; l <= last_; ++l) {
      Step& s = steps_[l - 1];
      s.hbar.resize(hc);
      s.rstd.resize(static_cast<size_t>(rows) * n_);
      s.ta.resize(static_cast<size_t>(rows) * n_ * (n_ + 1));
      s.tb.resize(static_cast<size_t>(rows) * n_);
      s.coef.resize(static_cast<size_t>(rows) * n_ * (n_ + 2));
      s.u.resize(nc);
      s.y.resize(nc);
    }
    dhyper_.resize(hc);
    dnext_.resize(hc);
    dhbar_.resize(hc);
    du_.resize(nc);
    dy_.resize(nc);
    dza_.resize(static_cast<size_t>(rows) * n_ * (n_ + 1));
    dzb_.resize(static_cast<size_t>(rows) * n_);
    dcoef_.resize(static_cast<size_t>(rows) * n_ * (n_ + 2));
    return absl::OkStatus();
  }

  // The state after sublayer l is the n streams.
  int BoundaryTensors(int l) const override { (void)l; return n_; }
  // Analyses: stream j of the state is boundary tensor j; its depth states are the n streams
  // after every layer (the embedding at depth 0).
  int streams() const override { return n_; }
  int BoundaryStream(int l, int i) const override { (void)l; return i; }
  void DepthStates(std::vector<typename TopologyT<B>::DepthStateRef>* refs) const override {
    HyperDepthStates<B>(hyper_, rows_, n_, d_, refs);
  }

  absl::Status ForwardRange(const Weights<B>& w, int first, int last, const T* h0,
                            const std::vector<const T*>& in, BranchesT<B>* br, T* x_final,
                            const std::vector<T*>& out) override {
    SATDAR_RETURN_IF_ERROR(
        StreamsIn(x_, hyper_[first - 1].data(), first == 1, h0, in, &in_list_, rows_, n_, d_));
    const int hr = rows_ * n_;
    for (int l = first; l <= last; ++l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      const T* h = hyper_[l - 1].data();
      SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, s.hbar.data(), s.rstd.data(), h,
                                                 w.compute + o.norm, hr, d_, eps_));
      SATDAR_RETURN_IF_ERROR(layers_internal::LinearForwardAcc(
          x_, s.ta.data(), s.hbar.data(), w.compute + o.dynamic_alpha, hr, n_ + 1, d_));
      SATDAR_RETURN_IF_ERROR(layers_internal::LinearForwardAcc(
          x_, s.tb.data(), s.hbar.data(), w.compute + o.dynamic_beta, hr, 1, d_));
      // ta, tb become their tanh; coef = static + scale * tanh.
      SATDAR_RETURN_IF_ERROR(ops::HcCoefForward(
          x_, s.coef.data(), s.ta.data(), n_ + 1, s.tb.data(), 1, w.master + o.static_alpha,
          w.master + o.static_beta, w.master + o.alpha_scale, w.master + o.beta_scale, rows_,
          n_));
      const HyperCoefs<Acc> c = HcCoefs(s.coef.data(), n_);
      // Width connection: the branch input h_in = sum_j A_m[j] H_j.
      SATDAR_RETURN_IF_ERROR(ops::HyperWidthForward(x_, s.u.data(), h, c, rows_, n_, d_));
      SATDAR_RETURN_IF_ERROR(br->Forward(l, s.u.data(), s.y.data()));
      // Depth connection: H'_m = B[m] y + sum_j A_r[j, m] H_j.
      SATDAR_RETURN_IF_ERROR(
          ops::HyperDepthForward(x_, hyper_[l].data(), h, s.y.data(), c, rows_, n_, d_));
    }
    SATDAR_RETURN_IF_ERROR(StreamsOut(x_, x_final, out, &out_list_, last == sublayers_,
                                      hyper_[last].data(), rows_, n_, d_));
    return absl::OkStatus();
  }

  absl::Status BackwardRange(const Weights<B>& w, Acc* grads, int first, int last,
                             const T* dx_final, const std::vector<const T*>& dout,
                             BranchesT<B>* br, T* dh0, const std::vector<T*>& din) override {
    const int hr = rows_ * n_;
    SATDAR_RETURN_IF_ERROR(StreamsOutBackward(x_, dhyper_.data(), last == sublayers_, dx_final,
                                              dout, &dout_list_, rows_, n_, d_));
    for (int l = last; l >= first; --l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      const T* h = hyper_[l - 1].data();
      dnext_.swap(dhyper_);  // dnext_ = d/d H after sublayer l
      const HyperCoefs<Acc> c = HcCoefs(s.coef.data(), n_), dc = HcCoefs(dcoef_.data(), n_);
      // Depth connection (dy_ and dhyper_ overwritten; d/dA_r, d/dB into dcoef_).
      SATDAR_RETURN_IF_ERROR(ops::HyperDepthBackward(x_, dy_.data(), dhyper_.data(), dc,
                                                     dnext_.data(), s.y.data(), h, c, rows_,
                                                     n_, d_));
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, du_.data(), static_cast<int64_t>(du_.size())));
      SATDAR_RETURN_IF_ERROR(br->Backward(l, s.u.data(), dy_.data(), du_.data()));
      // Width connection (d/dA_m into dcoef_).
      SATDAR_RETURN_IF_ERROR(ops::HyperWidthBackward(x_, dhyper_.data(), dc, du_.data(), h, c,
                                                     rows_, n_, d_));
      // Static and dynamic coefficients: dza_, dzb_ = d/d the projections before the tanh.
      SATDAR_RETURN_IF_ERROR(ops::HcCoefBackward(
          x_, dza_.data(), dzb_.data(), grads + o.static_alpha, grads + o.static_beta,
          grads + o.alpha_scale, grads + o.beta_scale, dcoef_.data(), s.ta.data(), n_ + 1,
          s.tb.data(), 1, w.master + o.alpha_scale, w.master + o.beta_scale, rows_, n_));
      // dhbar_ = dza_ dynamic_alpha (overwritten), then += dzb_ dynamic_beta.
      SATDAR_RETURN_IF_ERROR(layers_internal::LinearBackward(
          x_, dhbar_.data(), grads + o.dynamic_alpha, dza_.data(), s.hbar.data(),
          w.compute + o.dynamic_alpha, hr, n_ + 1, d_, /*overwrite=*/true));
      SATDAR_RETURN_IF_ERROR(layers_internal::LinearBackward(
          x_, dhbar_.data(), grads + o.dynamic_beta, dzb_.data(), s.hbar.data(),
          w.compute + o.dynamic_beta, hr, 1, d_, /*overwrite=*/false));
      SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(x_, dhyper_.data(), grads + o.norm,
                                                  dhbar_.data(), h, w.compute + o.norm,
                                                  s.rstd.data(), hr, d_));
    }
    SATDAR_RETURN_IF_ERROR(
        StreamsInBackward(x_, dh0, din, &din_list_, first == 1, dhyper_.data(), rows_, n_, d_));
    return absl::OkStatus();
  }

 private:
  struct Offsets {
    int64_t norm, static_alpha, static_beta, dynamic_alpha, dynamic_beta, alpha_scale, beta_scale;
  };
  struct Step {
    Vec<T> hbar;        // (N*n, C): RMSNorm(H_j)
    Vec<Acc> rstd;      // (N*n)
    Vec<Acc> ta, tb;    // (N*n, n+1), (N*n): tanh of the dynamic projections
    Vec<Acc> coef;      // (N, n(n+2)): [A_m[j] | A_r[j, .]] per j, then B (HcCoefs)
    Vec<T> u, y;        // (N, C): the branch's input and output
  };

  const int sublayers_, n_, d_;
  const double eps_;
  const typename B::Exec x_;
  std::vector<Offsets> offsets_;
  std::vector<Step> steps_;
  const int first_, last_;  // this pipeline stage's sublayers
  int rows_ = 0;
  std::vector<Vec<T>> hyper_;  // H before sublayer l+1 (index 0: the entry copies)
  Vec<T> dhyper_, dnext_, dhbar_, du_, dy_;
  Vec<T> dza_, dzb_;  // (N*n, n+1), (N*n): d/d the projections before the tanh
  Vec<Acc> dcoef_;    // (N, n(n+2)): d/d coef, HcCoefs' layout
  // A pipeline boundary's n tensors (the topology's in, out, dout, din) as the join / split
  // ops read them (hyper_streams.h writes and publishes them).
  typename B::template PtrList<const T*> in_list_, dout_list_;
  typename B::template PtrList<T*> out_list_, din_list_;
};

}  // namespace

void AddHcParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                 ParamTable* table) {
  HyperConnections<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeHc(const ModelConfig& config, const Sharding& shard,
                                     const typename B::Exec& x) {
  return std::make_unique<HyperConnections<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeHc<Cpu<float>>(const ModelConfig&,
                                                                   const Sharding&,
                                                                   const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeHc<Cpu<double>>(const ModelConfig&,
                                                                     const Sharding&,
                                                                     const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeHc<Cuda<float>>(const ModelConfig&,
                                                                     const Sharding&,
                                                                     const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeHc<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
