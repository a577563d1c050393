#include "model/variants/muddformer.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/matmul.h"
#include "core/ops/rmsnorm.h"
#include "model/variants/muddformer_ops.h"

namespace satdar::model {

namespace {

enum Way { kQ = 0, kK = 1, kV = 2, kR = 3 };

// Block i reads four inputs (X^Q, X^K, X^V, X^R) made by the dynamic dense connection after
// block i-1 over X_0..X_i (block 0 reads X_0 = h0 four times):
//   X_A = X^R + Attn(q: RMSNorm(X^Q; input_layernorm), k: RMSNorm(X^K; mudd.k_norm),
//                    v: RMSNorm(X^V; mudd.v_norm));  X_{i+1} = X_A + f_mlp(X_A)
//   A = w2 gelu(w1 RMS(X_{i+1})) + static  (per token, [C, i+2]);  X^c = sum_j A[c, j] X_j
// with C = 4 ways, or 1 (R only) after the last block, whose X^R is x_final.
template <typename T>
class MuddFormer : public Topology<T> {
 public:
  // A pipeline stage runs blocks [a_, b_) and keeps only their buffers; earlier X_j are read
  // in place from the previous stage's boundary. Under tensor parallelism the branches
  // all-reduce the attention output and the three inputs' gradients; the connections are
  // replicated.
  MuddFormer(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : layers_(c.num_hidden_layers), d_(c.hidden_size), eps_(c.rms_norm_eps), pool_(pool), blocks_(layers_), a_(shard.first_layer(c)),
        b_(shard.end_layer(c)) {}

  // Block i's connections: four (q, k, v, the residual), the last block's one.
  static int Ways(int i, int layers) { return i + 1 < layers ? 4 : 1; }
  int Ways(int i) const { return Ways(i, layers_); }
  static int Hidden(int ways, int sources) { return (ways * sources + 63) / 64 * 64; }
  static std::string Prefix(int i) { return absl::StrCat("model.layers.", i, ".mudd"); }

  static void AddParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                        int i, ParamTable* table) {
    (void)shard;
    if (place != ParamPlace::kLayer) return;
    const int64_t d = config.hidden_size;
    const double init_std = config.initializer_range;
    const int c = Ways(i, config.num_hidden_layers), s = i + 2, k = Hidden(c, s);
    std::vector<double> stat(c * s, 0.0);
    for (int w = 0; w < c; ++w) stat[w * s + i + 1] = 1.0;  // starts as the baseline
    const std::string p = Prefix(i);
    table->Add(p + ".w1", {k, d}, ParamInit::Normal(init_std));
    table->Add(p + ".w2", {c * s, k}, ParamInit::Constant(0.0));
    table->Add(p + ".static", {c, s}, ParamInit::Values(stat));
    table->Add(p + ".k_norm.weight", {d}, ParamInit::Constant(1.0));
    table->Add(p + ".v_norm.weight", {d}, ParamInit::Constant(1.0));
  }
  void Bind(const ParamTable& table) override {
    for (int i = a_; i < b_; ++i) {
      Block& b = blocks_[i];
      const std::string p = Prefix(i);
      b.w1 = table.Offset(p + ".w1");
      b.w2 = table.Offset(p + ".w2");
      b.stat = table.Offset(p + ".static");
      b.k_norm = table.Offset(p + ".k_norm.weight");
      b.v_norm = table.Offset(p + ".v_norm.weight");
      b.ln_attn = table.Offset(absl::StrCat("model.layers.", i, ".input_layernorm.weight"));
    }
  }
  void Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_;
    x_.assign(layers_ + 1, std::vector<T>());
    for (int j = a_ == 0 ? 0 : a_ + 1; j <= b_; ++j) x_[j].resize(nc);
    dx_.assign(b_ + 1, std::vector<T>(nc));
    dxs_.clear();
    for (auto& d : dx_) dxs_.push_back(d.data());
    xs_.assign(layers_ + 1, nullptr);
    for (int j = 0; j <= layers_; ++j) {
      if (!x_[j].empty()) xs_[j] = x_[j].data();
    }
    if (b_ < layers_) {  // the next stage's first inputs, made by this stage's last connection
      for (auto& w : blocks_[b_].ways) w.resize(nc);
      for (auto& w : blocks_[b_].dways) w.resize(nc);
    }
    for (int i = a_; i < b_; ++i) {
      Block& b = blocks_[i];
      const int c = Ways(i), s = i + 2, k = Hidden(c, s);
      for (auto& w : b.ways) w.resize(nc);
      for (auto& w : b.dways) w.resize(nc);
      for (auto& v : b.normed) v.resize(nc);
      for (auto& v : b.rstd) v.resize(rows);
      b.xa.resize(nc);
      b.r.resize(nc);
      b.r_rstd.resize(rows);
      b.h.resize(static_cast<size_t>(rows) * k);
      b.g.resize(static_cast<size_t>(rows) * k);
      b.a.resize(static_cast<size_t>(rows) * c * s);
    }
    y_.resize(nc);
    dxa_.resize(nc);
    dn_.resize(nc);
    dr_.resize(nc);
    for (auto& v : dnormed_) v.resize(nc);
    dh_.resize(static_cast<size_t>(rows) * Hidden(4, layers_ + 1));
    da_.resize(static_cast<size_t>(rows) * 4 * (layers_ + 1));
  }

  // After block k (sublayer 2k): X_0..X_k, which later connections read, and block k's four
  // inputs X^Q, X^K, X^V, X^R. Stages split at block boundaries only.
  int BoundaryTensors(int l) const override {
    SATDAR_CHECK(l % 2 == 0) << "MUDDFormer splits between blocks, not after sublayer " << l;
    return l / 2 + 5;
  }

  void ForwardRange(const T* params, int first, int last, const T* h0,
                    const std::vector<const T*>& in, Branches<T>* br, T* x_final,
                    const std::vector<T*>& out) override {
    const size_t nc = y_.size();
    T* p = const_cast<T*>(params);
    const int first_block = (first - 1) / 2, end_block = last / 2;
    if (first_block == 0) {
      std::copy(h0, h0 + nc, x_[0].begin());
      for (int w = 0; w < 4; ++w) std::copy(h0, h0 + nc, blocks_[0].ways[w].begin());
    } else {
      for (int j = 0; j <= first_block; ++j) xs_[j] = in[j];  // read in place
      for (int w = 0; w < 4; ++w) {
        const T* src = in[first_block + 1 + w];
        std::copy(src, src + nc, blocks_[first_block].ways[w].begin());
      }
    }
    for (int i = first_block; i < end_block; ++i) {
      Block& b = blocks_[i];
      const int64_t norms[3] = {b.ln_attn, b.k_norm, b.v_norm};
      for (int w = 0; w < 3; ++w) {
        core::cpu::RmsNormForward(b.normed[w].data(), b.rstd[w].data(), b.ways[w].data(),
                                  p + norms[w], rows_, d_, eps_, pool_);
      }
      br->AttentionNormedForward(i, b.normed[kQ].data(), b.normed[kK].data(), b.normed[kV].data(),
                                 y_.data());
      for (size_t e = 0; e < nc; ++e) b.xa[e] = b.ways[kR][e] + y_[e];
      br->Forward(2 * i + 2, b.xa.data(), y_.data());
      for (size_t e = 0; e < nc; ++e) x_[i + 1][e] = b.xa[e] + y_[e];
      DenseConnection(i, p, i + 1 < layers_ ? &blocks_[i + 1] : nullptr, x_final);
    }
    if (end_block < layers_) {
      for (int j = 0; j <= end_block; ++j) std::copy(xs_[j], xs_[j] + nc, out[j]);
      for (int w = 0; w < 4; ++w) {
        const std::vector<T>& src = blocks_[end_block].ways[w];
        std::copy(src.begin(), src.end(), out[end_block + 1 + w]);
      }
    }
  }

  void BackwardRange(const T* params, T* grads, int first, int last, const T* dx_final,
                     const std::vector<const T*>& dout, Branches<T>* br, T* dh0,
                     const std::vector<T*>& din) override {
    const size_t nc = y_.size();
    T* p = const_cast<T*>(params);
    const int first_block = (first - 1) / 2, end_block = last / 2;
    for (auto& d : dx_) std::fill(d.begin(), d.end(), T(0));
    if (end_block < layers_) {
      for (int j = 0; j <= end_block; ++j) std::copy(dout[j], dout[j] + nc, dx_[j].begin());
      for (int w = 0; w < 4; ++w) {
        const T* src = dout[end_block + 1 + w];
        std::copy(src, src + nc, blocks_[end_block].dways[w].begin());
      }
    }
    for (int i = end_block - 1; i >= first_block; --i) {
      Block& b = blocks_[i];
      // The connection after block i: its ways' gradients are those of block i+1's inputs.
      std::vector<const T*> dways;
      if (i + 1 < layers_) {
        for (int w = 0; w < 4; ++w) dways.push_back(blocks_[i + 1].dways[w].data());
      } else {
        dways.push_back(dx_final);
      }
      DenseConnectionBackward(i, p, grads, dways);
      // Block i: X_{i+1} = X_A + f_mlp(X_A); X_A = X^R + attention.
      std::copy(dx_[i + 1].begin(), dx_[i + 1].end(), dxa_.begin());
      br->Backward(2 * i + 2, b.xa.data(), dx_[i + 1].data(), dxa_.data());
      std::copy(dxa_.begin(), dxa_.end(), b.dways[kR].begin());
      for (auto& v : dnormed_) std::fill(v.begin(), v.end(), T(0));
      br->AttentionNormedBackward(i, b.normed[kQ].data(), b.normed[kK].data(), b.normed[kV].data(),
                                  dxa_.data(), dnormed_[kQ].data(), dnormed_[kK].data(),
                                  dnormed_[kV].data());
      const int64_t norms[3] = {b.ln_attn, b.k_norm, b.v_norm};
      for (int w = 0; w < 3; ++w) {
        std::fill(b.dways[w].begin(), b.dways[w].end(), T(0));
        core::cpu::RmsNormBackward(b.dways[w].data(), grads + norms[w], dnormed_[w].data(),
                                   b.ways[w].data(), p + norms[w], b.rstd[w].data(), rows_, d_,
                                   pool_);
      }
    }
    if (first_block > 0) {
      for (int j = 0; j <= first_block; ++j) std::copy(dx_[j].begin(), dx_[j].end(), din[j]);
      for (int w = 0; w < 4; ++w) {
        const std::vector<T>& g = blocks_[first_block].dways[w];
        std::copy(g.begin(), g.end(), din[first_block + 1 + w]);
      }
      return;
    }
    for (size_t e = 0; e < nc; ++e) {
      T g = dx_[0][e];
      for (int w = 0; w < 4; ++w) g += blocks_[0].dways[w][e];
      dh0[e] = g;
    }
  }

 private:
  struct Block {
    int64_t w1, w2, stat, k_norm, v_norm, ln_attn;
    std::vector<T> ways[4], dways[4];  // this block's inputs X^Q, X^K, X^V, X^R and gradients
    std::vector<T> normed[3], rstd[3];
    std::vector<T> xa;                 // X_A
    std::vector<T> r, r_rstd, h, g;     // the connection after this block
    std::vector<T> a;  // its dynamic coefficients (N, ways * sources), the static not added
  };

  // Ways of the connection after block i, written into next's inputs (or x_final).
  void DenseConnection(int i, T* p, Block* next, T* x_final) {
    Block& b = blocks_[i];
    const int c = Ways(i), s = i + 2, k = Hidden(c, s);
    std::vector<T> ones(d_, T(1));
    core::cpu::RmsNormForward(b.r.data(), b.r_rstd.data(), x_[i + 1].data(), ones.data(), rows_,
                              d_, eps_, pool_);
    core::cpu::MatmulForward(b.h.data(), b.r.data(), p + b.w1, rows_, k, d_, pool_);
    cpu::GeluForward(b.g.data(), b.h.data(), static_cast<int64_t>(b.h.size()), pool_);
    core::cpu::MatmulForward(b.a.data(), b.g.data(), p + b.w2, rows_, c * s, k, pool_);
    T* outs[4] = {};  // with one way it is R (the final hidden state)
    for (int w = 0; w < c; ++w) outs[w] = next ? next->ways[w].data() : x_final;
    cpu::DenseCombineForward(outs, c, xs_.data(), s, b.a.data(), c * s, p + b.stat, rows_, d_,
                             pool_);
  }

  void DenseConnectionBackward(int i, T* p, T* grads, const std::vector<const T*>& dways) {
    Block& b = blocks_[i];
    const int c = Ways(i), s = i + 2, k = Hidden(c, s);
    cpu::DenseCombineBackward(da_.data(), grads + b.stat, dxs_.data(), dways.data(), c,
                              xs_.data(), s, b.a.data(), c * s, p + b.stat, rows_, d_, pool_);
    std::fill(dh_.begin(), dh_.begin() + static_cast<size_t>(rows_) * k, T(0));
    core::cpu::MatmulBackward(dh_.data(), grads + b.w2, da_.data(), b.g.data(), p + b.w2, rows_,
                              c * s, k, pool_);
    cpu::GeluBackward(dh_.data(), dh_.data(), b.h.data(), static_cast<int64_t>(rows_) * k, pool_);
    std::fill(dr_.begin(), dr_.end(), T(0));
    core::cpu::MatmulBackward(dr_.data(), grads + b.w1, dh_.data(), b.r.data(), p + b.w1, rows_, k,
                              d_, pool_);
    // RMS without a gain: the gain gradient is discarded.
    std::vector<T> ones(d_, T(1)), dgain(d_, T(0));
    core::cpu::RmsNormBackward(dx_[i + 1].data(), dgain.data(), dr_.data(), x_[i + 1].data(),
                               ones.data(), b.r_rstd.data(), rows_, d_, pool_);
  }

  const int layers_, d_;
  const double eps_;
  core::ThreadPool* pool_;
  std::vector<Block> blocks_;
  const int a_, b_;  // this pipeline stage's blocks [a_, b_)
  int rows_ = 0;
  std::vector<std::vector<T>> x_, dx_;  // X_0..X_L (this stage's) and their gradients
  std::vector<const T*> xs_;            // X_j: x_[j], or an earlier stage's, read in place
  std::vector<T*> dxs_;                 // dx_[j].data(), the ops' list of the X_j gradients
  std::vector<T> y_, dxa_, dn_, dr_, dh_, da_;
  std::vector<T> dnormed_[3];
};

}  // namespace

void AddMuddFormerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                         int layer, ParamTable* table) {
  MuddFormer<float>::AddParams(config, shard, place, layer, table);
}

template <typename T>
std::unique_ptr<Topology<T>> MakeMuddFormer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<MuddFormer<T>>(config, shard, pool);
}

template std::unique_ptr<Topology<float>> MakeMuddFormer<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeMuddFormer<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
