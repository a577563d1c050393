#include "model/variants/mhc.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/matmul.h"
#include "core/thread_pool.h"
#include "model/variants/hyper_ops.h"
#include "model/variants/hyper_streams.h"

namespace satdar::model {

namespace {

// Matrices kept per token: the row softmax, then the output of each normalisation.
constexpr int kSinkhornSteps = 2 * kMhcSinkhornIterations;

template <typename T>
class Mhc : public Topology<T> {
 public:
  // A pipeline stage keeps its own sublayers' steps; its boundary carries the n streams.
  Mhc(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : sublayers_(2 * c.num_hidden_layers), n_(c.hc_streams), d_(c.hidden_size),
        mixes_(n_ * (n_ + 2)), eps_(c.rms_norm_eps), pool_(pool),
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

  void Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_, hc = nc * n_;
    hyper_.assign(sublayers_ + 1, std::vector<T>());
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
  }

  // The state after sublayer l is the n streams.
  int BoundaryTensors(int l) const override { (void)l; return n_; }

  void ForwardRange(const T* params, int first, int last, const T* h0,
                    const std::vector<const T*>& in, Branches<T>* br, T* x_final,
                    const std::vector<T*>& out) override {
    T* p = const_cast<T*>(params);
    StreamsIn(hyper_[first - 1].data(), first == 1, h0, in, rows_, n_, d_, pool_);
    for (int l = first; l <= last; ++l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      // mixes = (fn x) / rms(x) over x = vec(H) of each token.
      const T* h = hyper_[l - 1].data();
      core::cpu::MatmulForward(s.raw.data(), h, p + o.fn, rows_, mixes_, n_ * d_, pool_);
      cpu::MhcRms(s.rms.data(), h, rows_, n_ * d_, eps_, pool_);
      cpu::MhcCoefForward(s.coef.data(), s.logits.data(), s.raw.data(), mixes_, s.rms.data(),
                          params + o.scale, params + o.base, rows_, n_, pool_);
      cpu::SinkhornForward(s.sinkhorn.data(), s.logits.data(), rows_, n_, kMhcSinkhornIterations,
                           pool_);
      const HyperCoefs<T> c = Coefs(&s);
      cpu::HyperWidthForward(s.u.data(), h, c, rows_, n_, d_, pool_);
      br->Forward(l, s.u.data(), s.y.data());
      cpu::HyperDepthForward(hyper_[l].data(), h, s.y.data(), c, rows_, n_, d_, pool_);
    }
    StreamsOut(x_final, out, last == sublayers_, hyper_[last].data(), rows_, n_, d_, pool_);
  }

  void BackwardRange(const T* params, T* grads, int first, int last, const T* dx_final,
                     const std::vector<const T*>& dout, Branches<T>* br, T* dh0,
                     const std::vector<T*>& din) override {
    T* p = const_cast<T*>(params);
    StreamsOutBackward(dhyper_.data(), last == sublayers_, dx_final, dout, rows_, n_, d_,
                       pool_);
    for (int l = last; l >= first; --l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      const T* h = hyper_[l - 1].data();
      dnext_.swap(dhyper_);
      const HyperCoefs<T> c = Coefs(&s), dc = GradCoefs();
      cpu::HyperDepthBackward(dy_.data(), dhyper_.data(), dc, dnext_.data(), s.y.data(), h, c,
                              rows_, n_, d_, pool_);
      std::fill(du_.begin(), du_.end(), T(0));
      br->Backward(l, s.u.data(), dy_.data(), du_.data());
      cpu::HyperWidthBackward(dhyper_.data(), dc, du_.data(), h, c, rows_, n_, d_, pool_);
      // Through the Sinkhorn and the coefficients to raw (draw_, in place of [dpre | dpost]),
      // scale, base and the rms path into dH, then through the projection to fn and H.
      const int nd = n_ * d_;
      cpu::SinkhornBackward(dlogits_.data(), dres_.data(), s.sinkhorn.data(), rows_, n_,
                            kMhcSinkhornIterations, pool_);
      cpu::MhcCoefBackward(draw_.data(), dz_.data(), grads + o.scale, grads + o.base,
                           dhyper_.data(), draw_.data(), dlogits_.data(), s.coef.data(),
                           s.raw.data(), mixes_, s.rms.data(), params + o.scale,
                           hyper_[l - 1].data(), rows_, n_, nd, pool_);
      core::cpu::MatmulBackward(dhyper_.data(), grads + o.fn, draw_.data(),
                                hyper_[l - 1].data(), p + o.fn, rows_, mixes_, nd, pool_);
    }
    StreamsInBackward(dh0, din, first == 1, dhyper_.data(), rows_, n_, d_, pool_);
  }

 private:
  struct Offsets {
    int64_t fn, scale, base;
  };
  struct Step {
    std::vector<T> raw;       // (N, n(n+2)): fn x before the RMS scale
    std::vector<T> rms;       // (N)
    std::vector<T> coef;      // (N, 2n): pre, post
    std::vector<T> logits;    // (N, n, n): the Sinkhorn's input
    std::vector<T> sinkhorn;  // (N, steps, n, n): softmax, then every normalisation
    std::vector<T> u, y;
  };

  // Where a step's pre, post (coef) and res (the last Sinkhorn iterate) lie.
  HyperCoefs<T> Coefs(Step* s) const {
    HyperCoefs<T> c;
    c.pre = s->coef.data();
    c.pre_token = 2 * n_;
    c.post = s->coef.data() + n_;
    c.post_token = 2 * n_;
    c.res = s->sinkhorn.data() + static_cast<size_t>(kSinkhornSteps - 1) * n_ * n_;
    c.res_token = static_cast<int64_t>(kSinkhornSteps) * n_ * n_;
    c.res_row = n_;
    return c;
  }
  // The mixing backward's gradients of pre and post go to draw_ (N, n(n+2)) laid out as
  // [pre | post | unused], which cpu::MhcCoefBackward turns into d/d(raw) in place; those of
  // the Sinkhorn's result to dres_ (N, n, n).
  HyperCoefs<T> GradCoefs() {
    HyperCoefs<T> c;
    c.pre = draw_.data();
    c.pre_token = mixes_;
    c.post = draw_.data() + n_;
    c.post_token = mixes_;
    c.res = dres_.data();
    c.res_token = static_cast<int64_t>(n_) * n_;
    c.res_row = n_;
    return c;
  }

  const int sublayers_, n_, d_, mixes_;
  const double eps_;
  core::ThreadPool* pool_;
  std::vector<Offsets> offsets_;
  std::vector<Step> steps_;
  const int first_, last_;  // this pipeline stage's sublayers
  int rows_ = 0;
  std::vector<std::vector<T>> hyper_;
  std::vector<T> dhyper_, dnext_, du_, dy_, draw_;
  std::vector<T> dz_, dres_, dlogits_;  // (N, mixes), (N, n, n), (N, n, n)
};

}  // namespace

void AddMhcParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                  ParamTable* table) {
  Mhc<float>::AddParams(config, shard, place, layer, table);
}

template <typename T>
std::unique_ptr<Topology<T>> MakeMhc(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<Mhc<T>>(config, shard, pool);
}

template std::unique_ptr<Topology<float>> MakeMhc<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeMhc<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
