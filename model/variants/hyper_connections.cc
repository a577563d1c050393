#include "model/variants/hyper_connections.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/matmul.h"
#include "model/variants/hyper_streams.h"
#include "core/ops/rmsnorm.h"

namespace satdar::model {

namespace cpu = core::cpu;

namespace {

// Every token carries n streams, stored interleaved as (B*T, n*C): row r, stream j is
// H + (r*n + j)*C, so the per-stream RMSNorm and projections run over B*T*n rows.
template <typename T>
class HyperConnections : public Topology<T> {
 public:
  // A pipeline stage keeps its own sublayers' steps; its boundary carries the n streams.
  HyperConnections(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : sublayers_(2 * c.num_hidden_layers), n_(c.hc_streams), d_(c.hidden_size),
        eps_(c.rms_norm_eps), pool_(pool), offsets_(sublayers_), steps_(sublayers_),
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

  void Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_, hc = nc * n_;
    hyper_.assign(sublayers_ + 1, std::vector<T>());
    for (int l = first_ - 1; l <= last_; ++l) hyper_[l].resize(hc);
    for (int l = first_; l <= last_; ++l) {
      Step& s = steps_[l - 1];
      s.hbar.resize(hc);
      s.rstd.resize(static_cast<size_t>(rows) * n_);
      s.ta.resize(static_cast<size_t>(rows) * n_ * (n_ + 1));
      s.tb.resize(static_cast<size_t>(rows) * n_);
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
  }

  // The state after sublayer l is the n streams.
  int BoundaryTensors(int l) const override { (void)l; return n_; }

  void ForwardRange(const T* params, int first, int last, const T* h0,
                    const std::vector<const T*>& in, Branches<T>* br, T* x_final,
                    const std::vector<T*>& out) override {
    T* p = const_cast<T*>(params);
    StreamsIn(hyper_[first - 1].data(), first == 1, h0, in, rows_, n_, d_);
    const int hr = rows_ * n_;
    for (int l = first; l <= last; ++l) {
      Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      const T* h = hyper_[l - 1].data();
      cpu::RmsNormForward(s.hbar.data(), s.rstd.data(), h, p + o.norm, hr, d_, eps_, pool_);
      cpu::MatmulForward(s.ta.data(), s.hbar.data(), p + o.dynamic_alpha, hr, n_ + 1, d_, pool_);
      cpu::MatmulForward(s.tb.data(), s.hbar.data(), p + o.dynamic_beta, hr, 1, d_, pool_);
      for (T& v : s.ta) v = std::tanh(v);
      for (T& v : s.tb) v = std::tanh(v);
      // Width connection: the branch input h_in = sum_j A_m[j] H_j.
      for (int r = 0; r < rows_; ++r) {
        T* u = s.u.data() + static_cast<size_t>(r) * d_;
        std::fill(u, u + d_, T(0));
        for (int j = 0; j < n_; ++j) {
          const T am = Alpha(params, o, s, r, j, 0);
          const T* hj = H(l - 1, r, j);
          for (int c = 0; c < d_; ++c) u[c] += am * hj[c];
        }
      }
      br->Forward(l, s.u.data(), s.y.data());
      // Depth connection: H'_m = B[m] y + sum_j A_r[j, m] H_j.
      for (int r = 0; r < rows_; ++r) {
        const T* y = s.y.data() + static_cast<size_t>(r) * d_;
        for (int m = 0; m < n_; ++m) {
          T* out = H(l, r, m);
          const T bm = Beta(params, o, s, r, m);
          for (int c = 0; c < d_; ++c) out[c] = bm * y[c];
          for (int j = 0; j < n_; ++j) {
            const T ar = Alpha(params, o, s, r, j, 1 + m);
            const T* hj = H(l - 1, r, j);
            for (int c = 0; c < d_; ++c) out[c] += ar * hj[c];
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
    const int hr = rows_ * n_;
    StreamsOutBackward(dhyper_.data(), last == sublayers_, dx_final, dout, rows_, n_, d_);
    for (int l = last; l >= first; --l) {
      const Step& s = steps_[l - 1];
      const Offsets& o = offsets_[l - 1];
      dnext_.swap(dhyper_);  // dnext_ = d/d H after sublayer l
      std::fill(dhyper_.begin(), dhyper_.end(), T(0));
      std::fill(dza_.begin(), dza_.end(), T(0));
      // Depth connection.
      for (int r = 0; r < rows_; ++r) {
        const T* y = s.y.data() + static_cast<size_t>(r) * d_;
        T* dy = dy_.data() + static_cast<size_t>(r) * d_;
        std::fill(dy, dy + d_, T(0));
        for (int m = 0; m < n_; ++m) {
          const T* g = dnext_.data() + (static_cast<size_t>(r) * n_ + m) * d_;
          const T bm = Beta(params, o, s, r, m);
          T dot = 0;
          for (int c = 0; c < d_; ++c) {
            dy[c] += bm * g[c];
            dot += y[c] * g[c];
          }
          dzb_[r * n_ + m] = dot;  // d/dB[m], turned into d/dz below
          for (int j = 0; j < n_; ++j) {
            const T* hj = H(l - 1, r, j);
            T* dhj = dhyper_.data() + (static_cast<size_t>(r) * n_ + j) * d_;
            const T ar = Alpha(params, o, s, r, j, 1 + m);
            T dar = 0;
            for (int c = 0; c < d_; ++c) {
              dar += hj[c] * g[c];
              dhj[c] += ar * g[c];
            }
            dza_[(static_cast<size_t>(r) * n_ + j) * (n_ + 1) + 1 + m] = dar;
          }
        }
      }
      std::fill(du_.begin(), du_.end(), T(0));
      br->Backward(l, s.u.data(), dy_.data(), du_.data());
      // Width connection.
      for (int r = 0; r < rows_; ++r) {
        const T* du = du_.data() + static_cast<size_t>(r) * d_;
        for (int j = 0; j < n_; ++j) {
          const T* hj = H(l - 1, r, j);
          T* dhj = dhyper_.data() + (static_cast<size_t>(r) * n_ + j) * d_;
          const T am = Alpha(params, o, s, r, j, 0);
          T dam = 0;
          for (int c = 0; c < d_; ++c) {
            dam += hj[c] * du[c];
            dhj[c] += am * du[c];
          }
          dza_[(static_cast<size_t>(r) * n_ + j) * (n_ + 1)] = dam;
        }
      }
      // Static and dynamic coefficients: a = s_a tanh(za) + static, B = s_b tanh(zb) + static.
      const T sa = params[o.alpha_scale], sb = params[o.beta_scale];
      double dsa = 0, dsb = 0;
      for (int r = 0; r < rows_; ++r) {
        for (int j = 0; j < n_; ++j) {
          for (int c = 0; c <= n_; ++c) {
            const size_t idx = (static_cast<size_t>(r) * n_ + j) * (n_ + 1) + c;
            const T da = dza_[idx], t = s.ta[idx];
            grads[o.static_alpha + j * (n_ + 1) + c] += da;
            dsa += static_cast<double>(da) * t;
            dza_[idx] = da * sa * (T(1) - t * t);
          }
          const size_t jb = static_cast<size_t>(r) * n_ + j;
          const T db = dzb_[jb], t = s.tb[jb];
          grads[o.static_beta + j] += db;
          dsb += static_cast<double>(db) * t;
          dzb_[jb] = db * sb * (T(1) - t * t);
        }
      }
      grads[o.alpha_scale] += static_cast<T>(dsa);
      grads[o.beta_scale] += static_cast<T>(dsb);
      std::fill(dhbar_.begin(), dhbar_.end(), T(0));
      cpu::MatmulBackward(dhbar_.data(), grads + o.dynamic_alpha, dza_.data(), s.hbar.data(),
                          p + o.dynamic_alpha, hr, n_ + 1, d_, pool_);
      cpu::MatmulBackward(dhbar_.data(), grads + o.dynamic_beta, dzb_.data(), s.hbar.data(),
                          p + o.dynamic_beta, hr, 1, d_, pool_);
      cpu::RmsNormBackward(dhyper_.data(), grads + o.norm, dhbar_.data(), hyper_[l - 1].data(),
                           p + o.norm, s.rstd.data(), hr, d_, pool_);
    }
    StreamsInBackward(dh0, din, first == 1, dhyper_.data(), rows_, n_, d_);
  }

 private:
  struct Offsets {
    int64_t norm, static_alpha, static_beta, dynamic_alpha, dynamic_beta, alpha_scale, beta_scale;
  };
  struct Step {
    std::vector<T> hbar, rstd, ta, tb, u, y;  // ta, tb: tanh of the dynamic projections
  };
  T* H(int l, int r, int j) { return hyper_[l].data() + (static_cast<size_t>(r) * n_ + j) * d_; }
  // a_j[c] for token r (c = 0: A_m[j]; c = 1 + m: A_r[j, m]).
  T Alpha(const T* p, const Offsets& o, const Step& s, int r, int j, int c) const {
    return p[o.alpha_scale] * s.ta[(static_cast<size_t>(r) * n_ + j) * (n_ + 1) + c] +
           p[o.static_alpha + j * (n_ + 1) + c];
  }
  T Beta(const T* p, const Offsets& o, const Step& s, int r, int m) const {
    return p[o.beta_scale] * s.tb[static_cast<size_t>(r) * n_ + m] + p[o.static_beta + m];
  }

  const int sublayers_, n_, d_;
  const double eps_;
  core::ThreadPool* pool_;
  std::vector<Offsets> offsets_;
  std::vector<Step> steps_;
  const int first_, last_;  // this pipeline stage's sublayers
  int rows_ = 0;
  std::vector<std::vector<T>> hyper_;  // H before sublayer l+1 (index 0: the entry copies)
  std::vector<T> dhyper_, dnext_, dhbar_, du_, dy_, dza_, dzb_;
};

}  // namespace

void AddHcParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                 ParamTable* table) {
  HyperConnections<float>::AddParams(config, shard, place, layer, table);
}

template <typename T>
std::unique_ptr<Topology<T>> MakeHc(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<HyperConnections<T>>(config, shard, pool);
}

template std::unique_ptr<Topology<float>> MakeHc<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeHc<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
