#include "model/variants/mhc.h"

#include <memory>
#include <cmath>
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

// Matrices kept per token: the row softmax, then the output of each normalisation.
constexpr int kSinkhornSteps = 2 * kMhcSinkhornIterations;

// The mix logits, rms, coefficients, Sinkhorn iterates and their gradients are B::Acc, as the
// ops take them (fp32 on CUDA; T on the CPU, where Acc == T).
template <class B>
class Mhc : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // A pipeline stage keeps its own sublayers' steps; its boundary carries the n streams.
  Mhc(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : sublayers_(2 * c.num_hidden_layers), n_(c.hc_streams), d_(c.hidden_size),
        mixes_(n_ * (n_ + 2)), eps_(c.rms_norm_eps), x_(x),
        offsets_(sublayers_), steps_(sublayers_), first_(2 * shard.first_layer(c) + 1),
        last_(2 * shard.end_layer(c)) {}

  static std::string Prefix(int l) {
    return absl::StrCat("model.layers.", (l - 1) / 2, l % 2 == 1 ? ".attn_mhc" : ".mlp_mhc");
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)shard;
    if (place != ParamPlace::kLayer) return;
    const int n = c.hc_streams, mixes = n * (n + 2);
    const int64_t d = c.hidden_size;
    const double init_std = c.initializer_range;
    std::vector<double> base(mixes, 0.0);
    for (int j = 0; j < n; ++j) base[j] = n > 1 ? -std::log(n - 1.0) : 0.0;  // sigmoid = 1/n
    for (int j = 0; j < n; ++j) base[2 * n + j * n + j] = 4.0;  // residual mixing ~ identity
    for (int l : {2 * i + 1, 2 * i + 2}) {
      const std::string p = Prefix(l);
      table->Add(p + ".fn", {mixes, n * d}, ParamInit::Normal(init_std));
      table->Add(p + ".scale", {3}, ParamInit::Constant(0.01));
      table->Add(p + ".base", {mixes}, ParamInit::Values(base));
    }
  }
  void Bind(const ParamTable& table) override {
    for (int l = first_; l <= last_; ++l) {
      offsets_[l - 1] = {table.Offset(Prefix(l) + ".fn"), table.Offset(Prefix(l) + ".scale"),
                         table.Offset(Prefix(l) + ".base")};
    }
  }

  absl::Status Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_, hc = nc * n_;
    hyper_.assign(sublayers_ + 1, Vec<T>());
    for (int l = first_ - 1; l <= last_; ++l) hyper_[l].resize(hc);
    for (int l = first_; l <= last_; ++l) {
      Step& s = steps_[l - 1];
      s.raw.resize(static_cast<size_t>(rows) * mixes_);
      s.rms.resize(rows);
      s.coef.resize(static_cast<size_t>(rows) * 2 * n_);
      s.logits.resize(static_cast<size_t>(rows) * n_ * n_);
      s.sinkhorn.resize(static_cast<size_t>(rows) * kSinkhornSteps * n_ * n_);
      s.u.resize(nc);
      s.y.resize(nc);
    }
    dhyper_.resize(hc);
    dnext_.resize(hc);
    du_.resize(nc);
    dy_.resize(nc);
    draw_.resize(static_cast<size_t>(rows) * mixes_);
    dz_.resize(static_cast<size_t>(rows) * mixes_);
    dres_.resize(static_cast<size_t>(rows) * n_ * n_);
    dlogits_.resize(static_cast<size_t>(rows) * n_ * n_);
    if constexpr (B::kDevice) dcoef_.resize(static_cast<size_t>(rows) * mixes_);
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
    for (int l = first; l <= last; ++l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      // mixes = (fn x) / rms(x) over x = vec(H) of each token.
      const T* h = hyper_[l - 1].data();
      SATDAR_RETURN_IF_ERROR(layers_internal::LinearForwardAcc(
          x_, s.raw.data(), h, w.compute + o.fn, rows_, mixes_, n_ * d_));
      SATDAR_RETURN_IF_ERROR(ops::MhcRms(x_, s.rms.data(), h, rows_, n_ * d_, eps_));
      SATDAR_RETURN_IF_ERROR(ops::MhcCoefForward(x_, s.coef.data(), s.logits.data(),
                                                 s.raw.data(), mixes_, s.rms.data(),
                                                 w.master + o.scale, w.master + o.base, rows_,
                                                 n_));
      SATDAR_RETURN_IF_ERROR(ops::SinkhornForward(x_, s.sinkhorn.data(), s.logits.data(), rows_,
                                                  n_, kMhcSinkhornIterations));
      const HyperCoefs<Acc> c = Coefs(&s);
      SATDAR_RETURN_IF_ERROR(ops::HyperWidthForward(x_, s.u.data(), h, c, rows_, n_, d_));
      SATDAR_RETURN_IF_ERROR(br->Forward(l, s.u.data(), s.y.data()));
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
    SATDAR_RETURN_IF_ERROR(StreamsOutBackward(x_, dhyper_.data(), last == sublayers_, dx_final,
                                              dout, &dout_list_, rows_, n_, d_));
    for (int l = last; l >= first; --l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      const T* h = hyper_[l - 1].data();
      dnext_.swap(dhyper_);
      const HyperCoefs<Acc> c = Coefs(&s), dc = GradCoefs();
      SATDAR_RETURN_IF_ERROR(ops::HyperDepthBackward(x_, dy_.data(), dhyper_.data(), dc,
                                                     dnext_.data(), s.y.data(), h, c, rows_,
                                                     n_, d_));
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, du_.data(), static_cast<int64_t>(du_.size())));
      SATDAR_RETURN_IF_ERROR(br->Backward(l, s.u.data(), dy_.data(), du_.data()));
      SATDAR_RETURN_IF_ERROR(ops::HyperWidthBackward(x_, dhyper_.data(), dc, du_.data(), h, c,
                                                     rows_, n_, d_));
      // Through the Sinkhorn and the coefficients to raw (draw_; on the CPU in place of
      // [dpre | dpost]), scale, base and the rms path into dH, then through the projection to
      // fn and H.
      const int nd = n_ * d_;
      SATDAR_RETURN_IF_ERROR(ops::SinkhornBackward(x_, dlogits_.data(), dres_.data(),
                                                   s.sinkhorn.data(), rows_, n_,
                                                   kMhcSinkhornIterations));
      SATDAR_RETURN_IF_ERROR(ops::MhcCoefBackward(
          x_, draw_.data(), dz_.data(), grads + o.scale, grads + o.base, dhyper_.data(),
          DcoefData(), dlogits_.data(), s.coef.data(), s.raw.data(), mixes_, s.rms.data(),
          w.master + o.scale, hyper_[l - 1].data(), rows_, n_, nd));
      SATDAR_RETURN_IF_ERROR(layers_internal::LinearBackward(
          x_, dhyper_.data(), grads + o.fn, draw_.data(), hyper_[l - 1].data(), w.compute + o.fn,
          rows_, mixes_, nd, /*overwrite=*/false));
    }
    SATDAR_RETURN_IF_ERROR(
        StreamsInBackward(x_, dh0, din, &din_list_, first == 1, dhyper_.data(), rows_, n_, d_));
    return absl::OkStatus();
  }

 private:
  struct Offsets {
    int64_t fn, scale, base;
  };
  struct Step {
    Vec<Acc> raw;       // (N, n(n+2)): fn x before the RMS scale
    Vec<Acc> rms;       // (N)
    Vec<Acc> coef;      // (N, 2n): pre, post
    Vec<Acc> logits;    // (N, n, n): the Sinkhorn's input
    Vec<Acc> sinkhorn;  // (N, steps, n, n): softmax, then every normalisation
    Vec<T> u, y;
  };

  // Where a step's pre, post (coef) and res (the last Sinkhorn iterate) lie.
  HyperCoefs<Acc> Coefs(Step* s) const {
    HyperCoefs<Acc> c;
    c.pre = s->coef.data();
    c.pre_token = 2 * n_;
    c.post = s->coef.data() + n_;
    c.post_token = 2 * n_;
    c.res = s->sinkhorn.data() + static_cast<size_t>(kSinkhornSteps - 1) * n_ * n_;
    c.res_token = static_cast<int64_t>(kSinkhornSteps) * n_ * n_;
    c.res_row = n_;
    return c;
  }
  // The mixing backward's gradients of pre and post go to DcoefData() (N, n(n+2)) laid out as
  // [pre | post | unused], which ops::MhcCoefBackward turns into d/d(raw) (draw_); those of
  // the Sinkhorn's result to dres_ (N, n, n).
  HyperCoefs<Acc> GradCoefs() {
    HyperCoefs<Acc> c;
    c.pre = DcoefData();
    c.pre_token = mixes_;
    c.post = DcoefData() + n_;
    c.post_token = mixes_;
    c.res = dres_.data();
    c.res_token = static_cast<int64_t>(n_) * n_;
    c.res_row = n_;
    return c;
  }
  // [dpre | dpost]: on the CPU draw_ itself (MhcCoefBackward works in place, as the CPU model
  // always did); on CUDA dcoef_ (fp32; draw_ is T and must not alias it there).
  Acc* DcoefData() {
    if constexpr (B::kDevice) {
      return dcoef_.data();
    } else {
      return draw_.data();
    }
  }

  const int sublayers_, n_, d_, mixes_;
  const double eps_;
  const typename B::Exec x_;
  std::vector<Offsets> offsets_;
  std::vector<Step> steps_;
  const int first_, last_;  // this pipeline stage's sublayers
  int rows_ = 0;
  std::vector<Vec<T>> hyper_;
  Vec<T> dhyper_, dnext_, du_, dy_, draw_;
  Vec<Acc> dz_, dres_, dlogits_;  // (N, mixes), (N, n, n), (N, n, n)
  Vec<Acc> dcoef_;                // (N, mixes): [dpre | dpost | unused], CUDA only (DcoefData)
  // A pipeline boundary's n tensors (the topology's in, out, dout, din) as the join / split
  // ops read them (hyper_streams.h writes and publishes them).
  typename B::template PtrList<const T*> in_list_, dout_list_;
  typename B::template PtrList<T*> out_list_, din_list_;
};

}  // namespace

void AddMhcParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                  ParamTable* table) {
  Mhc<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeMhc(const ModelConfig& config, const Sharding& shard,
                                      const typename B::Exec& x) {
  return std::make_unique<Mhc<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeMhc<Cpu<float>>(const ModelConfig&,
                                                                    const Sharding&,
                                                                    const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeMhc<Cpu<double>>(const ModelConfig&,
                                                                      const Sharding&,
                                                                      const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeMhc<Cuda<float>>(const ModelConfig&,
                                                                      const Sharding&,
                                                                      const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeMhc<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
