#include "model/variants/mhc.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/matmul.h"
#include "model/variants/hyper_streams.h"

namespace satdar::model {

namespace cpu = core::cpu;

namespace {

constexpr int kSinkhornIterations = 20;  // column normalisations
// Matrices kept per token: the row softmax, then the output of each normalisation.
constexpr int kSinkhornSteps = 2 * kSinkhornIterations;

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
      s.sinkhorn.resize(static_cast<size_t>(rows) * kSinkhornSteps * n_ * n_);
      s.u.resize(nc);
      s.y.resize(nc);
    }
    dhyper_.resize(hc);
    dnext_.resize(hc);
    du_.resize(nc);
    dy_.resize(nc);
    draw_.resize(static_cast<size_t>(rows) * mixes_);
  }

  // The state after sublayer l is the n streams.
  int BoundaryTensors(int l) const override { (void)l; return n_; }

  void ForwardRange(const T* params, int first, int last, const T* h0,
                    const std::vector<const T*>& in, Branches<T>* br, T* x_final,
                    const std::vector<T*>& out) override {
    T* p = const_cast<T*>(params);
    StreamsIn(hyper_[first - 1].data(), first == 1, h0, in, rows_, n_, d_);
    for (int l = first; l <= last; ++l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      // mixes = (fn x) / rms(x) over x = vec(H) of each token.
      cpu::MatmulForward(s.raw.data(), hyper_[l - 1].data(), p + o.fn, rows_, mixes_, n_ * d_, pool_);
      pool_->ParallelFor(rows_, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          Coefficients(params, o, hyper_[l - 1].data(), &s, static_cast<int>(r));
        }
      });
      for (int r = 0; r < rows_; ++r) {
        T* u = s.u.data() + static_cast<size_t>(r) * d_;
        std::fill(u, u + d_, T(0));
        for (int j = 0; j < n_; ++j) {
          const T pre = s.coef[static_cast<size_t>(r) * 2 * n_ + j];
          const T* hj = H(l - 1, r, j);
          for (int c = 0; c < d_; ++c) u[c] += pre * hj[c];
        }
      }
      br->Forward(l, s.u.data(), s.y.data());
      for (int r = 0; r < rows_; ++r) {
        const T* y = s.y.data() + static_cast<size_t>(r) * d_;
        const T* m = Final(s, r);
        for (int k = 0; k < n_; ++k) {
          T* out = H(l, r, k);
          const T post = s.coef[static_cast<size_t>(r) * 2 * n_ + n_ + k];
          for (int c = 0; c < d_; ++c) out[c] = post * y[c];
          for (int j = 0; j < n_; ++j) {
            const T* hj = H(l - 1, r, j);
            const T mjk = m[j * n_ + k];
            for (int c = 0; c < d_; ++c) out[c] += mjk * hj[c];
          }
        }
      }
    }
    StreamsOut(x_final, out, last == sublayers_, hyper_[last].data(), rows_, n_, d_);
  }

  void BackwardRange(const T* params, T* grads, int first, int last, const T* dx_final,
                     const std::vector<const T*>& dout, Branches<T>* br, T* dh0,
                     const std::vector<T*>& din) override {
    T* p = const_cast<T*>(params);
    StreamsOutBackward(dhyper_.data(), last == sublayers_, dx_final, dout, rows_, n_, d_);
    for (int l = last; l >= first; --l) {
      const Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      dnext_.swap(dhyper_);
      std::fill(dhyper_.begin(), dhyper_.end(), T(0));
      for (int r = 0; r < rows_; ++r) {
        const T* y = s.y.data() + static_cast<size_t>(r) * d_;
        T* dy = dy_.data() + static_cast<size_t>(r) * d_;
        std::fill(dy, dy + d_, T(0));
        const T* m = Final(s, r);
        for (int k = 0; k < n_; ++k) {
          const T* g = dnext_.data() + (static_cast<size_t>(r) * n_ + k) * d_;
          const T post = s.coef[static_cast<size_t>(r) * 2 * n_ + n_ + k];
          T dpost = 0;
          for (int c = 0; c < d_; ++c) {
            dy[c] += post * g[c];
            dpost += y[c] * g[c];
          }
          PostGrad(r)[k] = dpost;
          for (int j = 0; j < n_; ++j) {
            const T* hj = H(l - 1, r, j);
            T* dhj = dhyper_.data() + (static_cast<size_t>(r) * n_ + j) * d_;
            T dmjk = 0;
            for (int c = 0; c < d_; ++c) {
              dmjk += hj[c] * g[c];
              dhj[c] += m[j * n_ + k] * g[c];
            }
            ResGrad(r)[j * n_ + k] = dmjk;
          }
        }
      }
      std::fill(du_.begin(), du_.end(), T(0));
      br->Backward(l, s.u.data(), dy_.data(), du_.data());
      for (int r = 0; r < rows_; ++r) {
        const T* du = du_.data() + static_cast<size_t>(r) * d_;
        for (int j = 0; j < n_; ++j) {
          const T* hj = H(l - 1, r, j);
          T* dhj = dhyper_.data() + (static_cast<size_t>(r) * n_ + j) * d_;
          const T pre = s.coef[static_cast<size_t>(r) * 2 * n_ + j];
          T dpre = 0;
          for (int c = 0; c < d_; ++c) {
            dpre += hj[c] * du[c];
            dhj[c] += pre * du[c];
          }
          PreGrad(r)[j] = dpre;
        }
      }
      // Through the coefficients to the mixes, then to fn and x.
      std::vector<double> dscale(3, 0.0);
      std::vector<double> dbase(mixes_, 0.0);
      for (int r = 0; r < rows_; ++r) CoefficientsBackward(params, o, s, r, &dscale, &dbase);
      for (int k = 0; k < 3; ++k) grads[o.scale + k] += static_cast<T>(dscale[k]);
      for (int k = 0; k < mixes_; ++k) grads[o.base + k] += static_cast<T>(dbase[k]);
      // draw_ holds d/d(mixes); mixes = raw * rms with rms = 1/sqrt(mean(x^2) + eps).
      const int nd = n_ * d_;
      for (int r = 0; r < rows_; ++r) {
        T* dr = draw_.data() + static_cast<size_t>(r) * mixes_;
        const T* raw = s.raw.data() + static_cast<size_t>(r) * mixes_;
        const T rms = s.rms[r];
        T drms = 0;
        for (int k = 0; k < mixes_; ++k) {
          drms += dr[k] * raw[k];
          dr[k] *= rms;
        }
        const T* x = hyper_[l - 1].data() + static_cast<size_t>(r) * nd;
        T* dx = dhyper_.data() + static_cast<size_t>(r) * nd;
        const T coef = -drms * rms * rms * rms / nd;
        for (int e = 0; e < nd; ++e) dx[e] += coef * x[e];
      }
      cpu::MatmulBackward(dhyper_.data(), grads + o.fn, draw_.data(), hyper_[l - 1].data(),
                          p + o.fn, rows_, mixes_, nd, pool_);
    }
    StreamsInBackward(dh0, din, first == 1, dhyper_.data(), rows_, n_, d_);
  }

 private:
  struct Offsets {
    int64_t fn, scale, base;
  };
  struct Step {
    std::vector<T> raw;       // (N, n(n+2)): fn x before the RMS scale
    std::vector<T> rms;       // (N)
    std::vector<T> coef;      // (N, 2n): pre, post
    std::vector<T> sinkhorn;  // (N, steps, n, n): softmax, then every normalisation
    std::vector<T> u, y;
  };

  T* H(int l, int r, int j) { return hyper_[l].data() + (static_cast<size_t>(r) * n_ + j) * d_; }
  const T* Final(const Step& s, int r) const {
    return s.sinkhorn.data() + (static_cast<size_t>(r) * kSinkhornSteps + kSinkhornSteps - 1) * n_ * n_;
  }
  // Gradient slots reuse draw_ (N, n(n+2)) laid out as [pre | post | res] before the
  // coefficient backward turns them into d/d(mixes) in place.
  T* PreGrad(int r) { return draw_.data() + static_cast<size_t>(r) * mixes_; }
  T* PostGrad(int r) { return PreGrad(r) + n_; }
  T* ResGrad(int r) { return PreGrad(r) + 2 * n_; }

  static T Sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

  // pre, post and the Sinkhorn matrices of token r from its hyper state hyper_in.
  void Coefficients(const T* p, const Offsets& o, const T* hyper_in, Step* s, int r) {
    const int nd = n_ * d_;
    const T* h = hyper_in + static_cast<size_t>(r) * nd;
    T ss = 0;
    for (int e = 0; e < nd; ++e) ss += h[e] * h[e];
    const T rms = T(1) / std::sqrt(ss / nd + static_cast<T>(eps_));
    s->rms[r] = rms;
    const T* raw = s->raw.data() + static_cast<size_t>(r) * mixes_;
    T* coef = s->coef.data() + static_cast<size_t>(r) * 2 * n_;
    for (int j = 0; j < n_; ++j) {
      coef[j] = Sigmoid(p[o.scale] * raw[j] * rms + p[o.base + j]);
      coef[n_ + j] = T(2) * Sigmoid(p[o.scale + 1] * raw[n_ + j] * rms + p[o.base + n_ + j]);
    }
    // Sinkhorn: row softmax, then column / row normalisations, ending on a column one.
    T* m = s->sinkhorn.data() + static_cast<size_t>(r) * kSinkhornSteps * n_ * n_;
    for (int j = 0; j < n_; ++j) {
      T* row = m + j * n_;
      T mx = -1e300;
      for (int k = 0; k < n_; ++k) {
        row[k] = p[o.scale + 2] * raw[2 * n_ + j * n_ + k] * rms + p[o.base + 2 * n_ + j * n_ + k];
        mx = std::max(mx, row[k]);
      }
      T sum = 0;
      for (int k = 0; k < n_; ++k) sum += row[k] = std::exp(row[k] - mx);
      for (int k = 0; k < n_; ++k) row[k] /= sum;
    }
    for (int step = 1; step < kSinkhornSteps; ++step) {
      const T* a = m + (step - 1) * n_ * n_;
      T* b = m + step * n_ * n_;
      const bool column = step % 2 == 1;
      for (int q = 0; q < n_; ++q) {
        T sum = 0;
        for (int t = 0; t < n_; ++t) sum += column ? a[t * n_ + q] : a[q * n_ + t];
        for (int t = 0; t < n_; ++t) {
          if (column) {
            b[t * n_ + q] = a[t * n_ + q] / sum;
          } else {
            b[q * n_ + t] = a[q * n_ + t] / sum;
          }
        }
      }
    }
  }

  // Turns the [pre | post | res] gradients of token r (in draw_) into d/d(mixes) in place.
  void CoefficientsBackward(const T* p, const Offsets& o, const Step& s, int r,
                            std::vector<double>* dscale, std::vector<double>* dbase) {
    const T* raw = s.raw.data() + static_cast<size_t>(r) * mixes_;
    const T rms = s.rms[r];
    const T* coef = s.coef.data() + static_cast<size_t>(r) * 2 * n_;
    T* g = draw_.data() + static_cast<size_t>(r) * mixes_;
    for (int j = 0; j < n_; ++j) {
      const T pre = coef[j];
      const T dz = g[j] * pre * (T(1) - pre);
      (*dscale)[0] += static_cast<double>(dz) * raw[j] * rms;
      (*dbase)[j] += dz;
      g[j] = dz * p[o.scale];
      const T post = coef[n_ + j];  // 2 sigmoid(z): d/dz = post (1 - post / 2)
      const T dzp = g[n_ + j] * post * (T(1) - post / 2);
      (*dscale)[1] += static_cast<double>(dzp) * raw[n_ + j] * rms;
      (*dbase)[n_ + j] += dzp;
      g[n_ + j] = dzp * p[o.scale + 1];
    }
    // Back through the normalisations, then the row softmax.
    const T* m = s.sinkhorn.data() + static_cast<size_t>(r) * kSinkhornSteps * n_ * n_;
    std::vector<T> dm(g + 2 * n_, g + 2 * n_ + n_ * n_), da(n_ * n_);
    for (int step = kSinkhornSteps - 1; step >= 1; --step) {
      const T* a = m + (step - 1) * n_ * n_;
      const T* b = m + step * n_ * n_;
      const bool column = step % 2 == 1;
      for (int q = 0; q < n_; ++q) {
        T sum = 0, dot = 0;
        for (int t = 0; t < n_; ++t) {
          const int idx = column ? t * n_ + q : q * n_ + t;
          sum += a[idx];
          dot += dm[idx] * b[idx];
        }
        for (int t = 0; t < n_; ++t) {
          const int idx = column ? t * n_ + q : q * n_ + t;
          da[idx] = (dm[idx] - dot) / sum;
        }
      }
      dm.swap(da);
    }
    for (int j = 0; j < n_; ++j) {
      const T* row = m + j * n_;
      T dot = 0;
      for (int k = 0; k < n_; ++k) dot += dm[j * n_ + k] * row[k];
      for (int k = 0; k < n_; ++k) {
        const int idx = 2 * n_ + j * n_ + k;
        const T dz = row[k] * (dm[j * n_ + k] - dot);
        (*dscale)[2] += static_cast<double>(dz) * raw[idx] * rms;
        (*dbase)[idx] += dz;
        g[idx] = dz * p[o.scale + 2];
      }
    }
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
