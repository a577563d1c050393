#include "model/variants/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/matmul.h"
#include "model/layers/mlp.h"

namespace satdar::model {

namespace {

template <typename T>
class Moe : public Ffn<T> {
 public:
  Moe(const ModelConfig& c, core::ThreadPool* pool)
      : c_(c), m_(*c.moe), d_(c.hidden_size), e_(m_.num_experts), k_(m_.top_k),
        f_(m_.expert_intermediate_size), pool_(pool), layers_(c.num_hidden_layers),
        load_(c.num_hidden_layers, std::vector<int64_t>(m_.num_experts, 0)) {}

  static std::string Expert(int i, const char* group, int e, const char* proj) {
    return absl::StrCat("model.layers.", i, ".mlp.", group, ".", e, ".", proj, "_proj.weight");
  }
  static std::string Router(int i) { return absl::StrCat("model.layers.", i, ".mlp.router.weight"); }

  void AddLayerParams(int i, ParamTable* table) override {
    const ParamInit normal = ParamInit::Normal(c_.initializer_range);
    table->Add(Router(i), {e_, d_}, normal);
    for (const char* group : {"experts", "shared_experts"}) {
      const int count = group[0] == 'e' ? e_ : m_.num_shared_experts;
      for (int e = 0; e < count; ++e) {
        // gate and up back to back: one GEMM per expert.
        table->Add(Expert(i, group, e, "gate"), {f_, d_}, normal);
        table->Add(Expert(i, group, e, "up"), {f_, d_}, normal);
        table->Add(Expert(i, group, e, "down"), {d_, f_}, normal);
      }
    }
  }
  void Bind(const ParamTable& table) override {
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      Layer& L = layers_[i];
      L.router = table.Offset(Router(i));
      L.experts.clear();
      L.shared.clear();
      for (int e = 0; e < e_; ++e) L.experts.push_back(table.Offset(Expert(i, "experts", e, "gate")));
      for (int e = 0; e < m_.num_shared_experts; ++e) {
        L.shared.push_back(table.Offset(Expert(i, "shared_experts", e, "gate")));
      }
    }
  }
  void Resize(int b, int t) override {
    b_ = b;
    t_ = t;
    const size_t n = static_cast<size_t>(b) * t;
    for (Layer& L : layers_) {
      L.logits.resize(n * e_);
      L.probs.resize(n * e_);
      L.lse.resize(n);
      L.sel.resize(n * k_);
      L.weight.resize(n * k_);
      L.expert_acts.resize(e_);
      L.expert_out.resize(e_);
      L.shared_acts.resize(m_.num_shared_experts);
      for (auto& a : L.shared_acts) a.Resize(MlpDims{static_cast<int>(n), d_, f_});
    }
    shared_out_.resize(n * d_);
    dlogits_.resize(n * e_);
    dweight_.resize(n * k_);
  }

  double Forward(int i, const T* params, const T* z, T* out) override {
    Layer& L = layers_[i];
    const int n = b_ * t_;
    T* p = const_cast<T*>(params);
    core::cpu::MatmulForward(L.logits.data(), z, p + L.router, n, e_, d_, pool_);
    Route(&L, n);
    std::fill(out, out + static_cast<size_t>(n) * d_, T(0));
    // Each expert runs on the tokens routed to it (dropless), gathered into a dense block.
    std::vector<T> xe;
    for (int e = 0; e < e_; ++e) {
      const std::vector<int>& slots = L.tokens[e];
      const int ne = static_cast<int>(slots.size());
      load_[i][e] += ne;
      if (ne == 0) continue;
      Gather(z, slots, &xe);
      MlpDims dims{ne, d_, f_};
      L.expert_acts[e].Resize(dims);
      L.expert_out[e].resize(static_cast<size_t>(ne) * d_);
      MlpForward(L.expert_out[e].data(), &L.expert_acts[e], xe.data(), Weights(p, L.experts[e]),
                 dims, pool_);
      for (int r = 0; r < ne; ++r) {
        const int slot = slots[r], tok = slot / k_;
        const T w = L.weight[slot];
        const T* y = L.expert_out[e].data() + static_cast<size_t>(r) * d_;
        T* o = out + static_cast<size_t>(tok) * d_;
        for (int c = 0; c < d_; ++c) o[c] += w * y[c];
      }
    }
    for (int s = 0; s < m_.num_shared_experts; ++s) {
      MlpForward(shared_out_.data(), &L.shared_acts[s], z, Weights(p, L.shared[s]),
                 MlpDims{n, d_, f_}, pool_);
      for (size_t j = 0; j < shared_out_.size(); ++j) out[j] += shared_out_[j];
    }
    // Sequence-wise aux loss: coef * mean_b E sum_e f_e^b P_e^b; z-loss: coef * mean lse^2.
    double aux = 0;
    for (int b = 0; b < b_; ++b) {
      double sum = 0;
      for (int e = 0; e < e_; ++e) sum += L.fraction[b * e_ + e] * MeanProb(L, b, e);
      aux += e_ * sum;
    }
    aux = m_.router_aux_loss_coef * aux / b_;
    double zl = 0;
    for (int r = 0; r < n; ++r) zl += static_cast<double>(L.lse[r]) * L.lse[r];
    zl = m_.router_z_loss_coef * zl / n;
    return aux + zl;
  }

  void Backward(int i, const T* params, T* grads, const T* z, const T* dout, T* dz,
                double loss_scale) override {
    Layer& L = layers_[i];
    const int n = b_ * t_;
    T* p = const_cast<T*>(params);
    scratch_.Resize(MlpDims{n, d_, f_});
    for (int s = 0; s < m_.num_shared_experts; ++s) {
      MlpBackward(dz, Weights(grads, L.shared[s]), dout, L.shared_acts[s], z,
                  Weights(p, L.shared[s]), MlpDims{n, d_, f_}, &scratch_, pool_);
    }
    std::fill(dweight_.begin(), dweight_.end(), T(0));
    std::vector<T> xe, dy, dxe;
    for (int e = 0; e < e_; ++e) {
      const std::vector<int>& slots = L.tokens[e];
      const int ne = static_cast<int>(slots.size());
      if (ne == 0) continue;
      Gather(z, slots, &xe);
      dy.assign(static_cast<size_t>(ne) * d_, T(0));
      for (int r = 0; r < ne; ++r) {
        const int slot = slots[r], tok = slot / k_;
        const T* g = dout + static_cast<size_t>(tok) * d_;
        const T* y = L.expert_out[e].data() + static_cast<size_t>(r) * d_;
        T dot = 0;
        for (int c = 0; c < d_; ++c) {
          dy[static_cast<size_t>(r) * d_ + c] = L.weight[slot] * g[c];
          dot += y[c] * g[c];
        }
        dweight_[slot] = dot;
      }
      MlpDims dims{ne, d_, f_};
      scratch_.Resize(dims);
      dxe.assign(static_cast<size_t>(ne) * d_, T(0));
      MlpBackward(dxe.data(), Weights(grads, L.experts[e]), dy.data(), L.expert_acts[e], xe.data(),
                  Weights(p, L.experts[e]), dims, &scratch_, pool_);
      for (int r = 0; r < ne; ++r) {
        T* o = dz + static_cast<size_t>(slots[r] / k_) * d_;
        const T* g = dxe.data() + static_cast<size_t>(r) * d_;
        for (int c = 0; c < d_; ++c) o[c] += g[c];
      }
    }
    // d loss / d router probabilities, then through the softmax to the logits.
    const double aux_coef = loss_scale * m_.router_aux_loss_coef * e_ / (b_ * static_cast<double>(t_));
    const double z_coef = loss_scale * m_.router_z_loss_coef * 2.0 / n;
    std::vector<double> dp(e_);
    for (int r = 0; r < n; ++r) {
      const int b = r / t_;
      for (int e = 0; e < e_; ++e) dp[e] = aux_coef * L.fraction[b * e_ + e];
      const int* sel = L.sel.data() + static_cast<size_t>(r) * k_;
      const T* w = L.weight.data() + static_cast<size_t>(r) * k_;
      const T* dw = dweight_.data() + static_cast<size_t>(r) * k_;
      if (m_.norm_topk_prob) {
        double sum = 0, dot = 0;
        for (int j = 0; j < k_; ++j) {
          sum += L.probs[static_cast<size_t>(r) * e_ + sel[j]];
          dot += static_cast<double>(dw[j]) * w[j];
        }
        for (int j = 0; j < k_; ++j) dp[sel[j]] += (dw[j] - dot) / sum;
      } else {
        for (int j = 0; j < k_; ++j) dp[sel[j]] += dw[j];
      }
      const T* pr = L.probs.data() + static_cast<size_t>(r) * e_;
      double pdp = 0;
      for (int e = 0; e < e_; ++e) pdp += pr[e] * dp[e];
      T* dl = dlogits_.data() + static_cast<size_t>(r) * e_;
      for (int e = 0; e < e_; ++e) {
        dl[e] = static_cast<T>(pr[e] * (dp[e] - pdp) + z_coef * L.lse[r] * pr[e]);
      }
    }
    core::cpu::MatmulBackward(dz, grads + L.router, dlogits_.data(), z, p + L.router, n, e_, d_,
                              pool_);
  }

  void AppendStats(nlohmann::json* stats) const override {
    (*stats)["moe_expert_load"] = load_;  // [layer][expert]: tokens routed since the last reset
    (*stats)["moe_dropped_tokens"] = 0;   // dropless routing
  }
  void ResetStats() override {
    for (auto& l : load_) std::fill(l.begin(), l.end(), 0);
  }

 private:
  struct Layer {
    int64_t router = -1;
    std::vector<int64_t> experts, shared;  // offsets of each expert's gate_proj
    std::vector<T> logits, probs, lse, weight;
    std::vector<int> sel;                   // (N, k) chosen experts
    std::vector<double> fraction;           // (B, E): f_e^b
    std::vector<std::vector<int>> tokens;   // per expert: slots (token * k + j) routed to it
    std::vector<MlpActs<T>> expert_acts, shared_acts;
    std::vector<std::vector<T>> expert_out;  // per expert (n_e, C): its output before weighting
  };

  MlpWeights<T> Weights(T* base, int64_t gate) const {
    const int64_t size = static_cast<int64_t>(f_) * d_;
    return {base + gate, base + gate + size, base + gate + 2 * size};
  }
  void Gather(const T* z, const std::vector<int>& slots, std::vector<T>* out) const {
    out->resize(slots.size() * d_);
    for (size_t r = 0; r < slots.size(); ++r) {
      const T* src = z + static_cast<size_t>(slots[r] / k_) * d_;
      std::copy(src, src + d_, out->data() + r * d_);
    }
  }
  // Softmax, top-k (ties to the lower index) and the per-expert token lists.
  void Route(Layer* L, int n) {
    L->tokens.assign(e_, {});
    for (int r = 0; r < n; ++r) {
      const T* x = L->logits.data() + static_cast<size_t>(r) * e_;
      T* pr = L->probs.data() + static_cast<size_t>(r) * e_;
      T mx = x[0];
      for (int e = 1; e < e_; ++e) mx = std::max(mx, x[e]);
      T sum = 0;
      for (int e = 0; e < e_; ++e) sum += pr[e] = std::exp(x[e] - mx);
      for (int e = 0; e < e_; ++e) pr[e] /= sum;
      L->lse[r] = mx + std::log(sum);
      int* sel = L->sel.data() + static_cast<size_t>(r) * k_;
      std::vector<int> order(e_);
      for (int e = 0; e < e_; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[a] > pr[b]; });
      T total = 0;
      for (int j = 0; j < k_; ++j) total += pr[order[j]];
      for (int j = 0; j < k_; ++j) {
        sel[j] = order[j];
        L->weight[static_cast<size_t>(r) * k_ + j] =
            m_.norm_topk_prob ? pr[order[j]] / total : pr[order[j]];
      }
    }
    // Token lists in token order, so every run groups the same way; f_e^b, the fraction of
    // sequence b's T*k assignments routed to e (a count: it carries no gradient).
    L->fraction.assign(static_cast<size_t>(b_) * e_, 0.0);
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < k_; ++j) {
        const int e = L->sel[static_cast<size_t>(r) * k_ + j];
        L->tokens[e].push_back(r * k_ + j);
        L->fraction[(r / t_) * e_ + e] += 1.0 / (static_cast<double>(t_) * k_);
      }
    }
  }
  // P_e^b: mean router probability of e over sequence b.
  double MeanProb(const Layer& L, int b, int e) const {
    double sum = 0;
    for (int r = b * t_; r < (b + 1) * t_; ++r) sum += L.probs[static_cast<size_t>(r) * e_ + e];
    return sum / t_;
  }

  const ModelConfig c_;
  const MoeConfig m_;
  const int d_, e_, k_, f_;
  core::ThreadPool* pool_;
  std::vector<Layer> layers_;
  int b_ = 0, t_ = 0;
  std::vector<T> shared_out_, dlogits_, dweight_;
  MlpScratch<T> scratch_;
  std::vector<std::vector<int64_t>> load_;
};

}  // namespace

template <typename T>
std::unique_ptr<Ffn<T>> MakeMoe(const ModelConfig& config, core::ThreadPool* pool) {
  return std::make_unique<Moe<T>>(config, pool);
}

template std::unique_ptr<Ffn<float>> MakeMoe<float>(const ModelConfig&, core::ThreadPool*);
template std::unique_ptr<Ffn<double>> MakeMoe<double>(const ModelConfig&, core::ThreadPool*);

}  // namespace satdar::model
