#include "model/variants/muddformer.h"

#include <memory>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/exec.h"
#include "model/layers/linear.h"
#include "model/ops.h"
#include "model/variants/muddformer_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>

#include "core/dtype.h"
#include "core/ops/gemm_cuda.h"
#endif

namespace satdar::model {

namespace {

enum Way { kQ = 0, kK = 1, kV = 2, kR = 3 };

// Block i reads four inputs (X^Q, X^K, X^V, X^R) made by the dynamic dense connection after
// block i-1 over X_0..X_i (block 0 reads X_0 = h0 four times):
//   X_A = X^R + Attn(q: RMSNorm(X^Q; input_layernorm), k: RMSNorm(X^K; mudd.k_norm),
//                    v: RMSNorm(X^V; mudd.v_norm));  X_{i+1} = X_A + f_mlp(X_A)
//   A = w2 gelu(w1 RMS(X_{i+1})) + static  (per token, [C, i+2]);  X^c = sum_j A[c, j] X_j
// with C = 4 ways, or 1 (R only) after the last block, whose X^R is x_final.
// The RMSNorms' rstd and the coefficients A (and dA) are B::Acc, as the ops take them (fp32
// on CUDA; T on the CPU, where Acc == T).
template <class B>
class MuddFormer : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;
  template <typename P>
  using PtrList = typename B::template PtrList<P>;

  // A pipeline stage runs blocks [a_, b_) and keeps only their buffers; earlier X_j are read
  // in place from the previous stage's boundary. Under tensor parallelism the branches
  // all-reduce the attention output and the three inputs' gradients; the connections are
  // replicated.
  MuddFormer(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : layers_(c.num_hidden_layers), d_(c.hidden_size), eps_(c.rms_norm_eps), x_(x),
        blocks_(layers_), a_(shard.first_layer(c)), b_(shard.end_layer(c)) {}

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
  absl::Status Resize(int rows) override {
    rows_ = rows;
    const size_t nc = static_cast<size_t>(rows) * d_;
    xj_.assign(layers_ + 1, Vec<T>());
    for (int j = a_ == 0 ? 0 : a_ + 1; j <= b_; ++j) xj_[j].resize(nc);
    dxj_.assign(b_ + 1, Vec<T>());
    for (auto& d : dxj_) d.resize(nc);
    dxs_.clear();
    for (auto& d : dxj_) dxs_.push_back(d.data());
    SATDAR_RETURN_IF_ERROR(dxs_.Publish(x_));
    xs_.assign(layers_ + 1, nullptr);
    for (int j = 0; j <= layers_; ++j) {
      if (!xj_[j].empty()) xs_[j] = xj_[j].data();
    }
    SATDAR_RETURN_IF_ERROR(xs_.Publish(x_));
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
    if constexpr (B::kDevice) da_t_.resize(da_.size());
    return absl::OkStatus();
  }

  // After block k (sublayer 2k): X_0..X_k, which later connections read, and block k's four
  // inputs X^Q, X^K, X^V, X^R. Stages split at block boundaries only.
  int BoundaryTensors(int l) const override {
    SATDAR_CHECK(l % 2 == 0) << "MUDDFormer splits between blocks, not after sublayer " << l;
    return l / 2 + 5;
  }

  absl::Status ForwardRange(const Weights<B>& weights, int first, int last, const T* h0,
                            const std::vector<const T*>& in, BranchesT<B>* br, T* x_final,
                            const std::vector<T*>& out) override {
    const size_t nc = y_.size();
    const int first_block = (first - 1) / 2, end_block = last / 2;
    if (first_block == 0) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, xj_[0].data(), h0, nc));
      for (int w = 0; w < 4; ++w) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, blocks_[0].ways[w].data(), h0, nc));
      }
    } else {
      for (int j = 0; j <= first_block; ++j) xs_[j] = in[j];  // read in place
      SATDAR_RETURN_IF_ERROR(xs_.Publish(x_));
      for (int w = 0; w < 4; ++w) {
        SATDAR_RETURN_IF_ERROR(
            ops::Copy(x_, blocks_[first_block].ways[w].data(), in[first_block + 1 + w], nc));
      }
    }
    for (int i = first_block; i < end_block; ++i) {
      Block& b = blocks_[i];
      const int64_t norms[3] = {b.ln_attn, b.k_norm, b.v_norm};
      for (int w = 0; w < 3; ++w) {
        SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, b.normed[w].data(), b.rstd[w].data(),
                                                   b.ways[w].data(), weights.compute + norms[w],
                                                   rows_, d_, eps_));
      }
      SATDAR_RETURN_IF_ERROR(br->AttentionNormedForward(
          i, b.normed[kQ].data(), b.normed[kK].data(), b.normed[kV].data(), y_.data()));
      SATDAR_RETURN_IF_ERROR(ops::Add(x_, b.xa.data(), b.ways[kR].data(), y_.data(), nc));
      SATDAR_RETURN_IF_ERROR(br->Forward(2 * i + 2, b.xa.data(), y_.data()));
      SATDAR_RETURN_IF_ERROR(ops::Add(x_, xj_[i + 1].data(), b.xa.data(), y_.data(), nc));
      SATDAR_RETURN_IF_ERROR(
          DenseConnection(i, weights, i + 1 < layers_ ? &blocks_[i + 1] : nullptr, x_final));
    }
    if (end_block < layers_) {
      for (int j = 0; j <= end_block; ++j) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, out[j], xs_[j], nc));
      }
      for (int w = 0; w < 4; ++w) {
        const Vec<T>& src = blocks_[end_block].ways[w];
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, out[end_block + 1 + w], src.data(),
                                         static_cast<int64_t>(src.size())));
      }
    }
    return absl::OkStatus();
  }

  absl::Status BackwardRange(const Weights<B>& weights, Acc* grads, int first, int last,
                             const T* dx_final, const std::vector<const T*>& dout,
                             BranchesT<B>* br, T* dh0, const std::vector<T*>& din) override {
    const size_t nc = y_.size();
    const int first_block = (first - 1) / 2, end_block = last / 2;
    for (auto& d : dxj_) {
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, d.data(), static_cast<int64_t>(d.size())));
    }
    if (end_block < layers_) {
      for (int j = 0; j <= end_block; ++j) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dxj_[j].data(), dout[j], nc));
      }
      for (int w = 0; w < 4; ++w) {
        SATDAR_RETURN_IF_ERROR(
            ops::Copy(x_, blocks_[end_block].dways[w].data(), dout[end_block + 1 + w], nc));
      }
    }
    for (int i = end_block - 1; i >= first_block; --i) {
      Block& b = blocks_[i];
      // The connection after block i: its ways' gradients are those of block i+1's inputs.
      dways_.clear();
      if (i + 1 < layers_) {
        for (int w = 0; w < 4; ++w) dways_.push_back(blocks_[i + 1].dways[w].data());
      } else {
        dways_.push_back(dx_final);
      }
      SATDAR_RETURN_IF_ERROR(dways_.Publish(x_));
      SATDAR_RETURN_IF_ERROR(DenseConnectionBackward(i, weights, grads));
      // Block i: X_{i+1} = X_A + f_mlp(X_A); X_A = X^R + attention.
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dxa_.data(), dxj_[i + 1].data(), nc));
      SATDAR_RETURN_IF_ERROR(br->Backward(2 * i + 2, b.xa.data(), dxj_[i + 1].data(), dxa_.data()));
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, b.dways[kR].data(), dxa_.data(), nc));
      for (auto& v : dnormed_) {
        SATDAR_RETURN_IF_ERROR(ops::Zero(x_, v.data(), static_cast<int64_t>(v.size())));
      }
      SATDAR_RETURN_IF_ERROR(br->AttentionNormedBackward(
          i, b.normed[kQ].data(), b.normed[kK].data(), b.normed[kV].data(), dxa_.data(),
          dnormed_[kQ].data(), dnormed_[kK].data(), dnormed_[kV].data()));
      const int64_t norms[3] = {b.ln_attn, b.k_norm, b.v_norm};
      for (int w = 0; w < 3; ++w) {
        SATDAR_RETURN_IF_ERROR(
            ops::Zero(x_, b.dways[w].data(), static_cast<int64_t>(b.dways[w].size())));
        SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(
            x_, b.dways[w].data(), grads + norms[w], dnormed_[w].data(), b.ways[w].data(),
            weights.compute + norms[w], b.rstd[w].data(), rows_, d_));
      }
    }
    if (first_block > 0) {
      for (int j = 0; j <= first_block; ++j) {
        SATDAR_RETURN_IF_ERROR(
            ops::Copy(x_, din[j], dxj_[j].data(), static_cast<int64_t>(dxj_[j].size())));
      }
      for (int w = 0; w < 4; ++w) {
        const Vec<T>& g = blocks_[first_block].dways[w];
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, din[first_block + 1 + w], g.data(),
                                         static_cast<int64_t>(g.size())));
      }
      return absl::OkStatus();
    }
    // dh0 = dX_0 + dX^Q + dX^K + dX^V + dX^R of block 0, added in that order.
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dh0, dxj_[0].data(), nc));
    for (int w = 0; w < 4; ++w) {
      SATDAR_RETURN_IF_ERROR(ops::AddTo(x_, dh0, blocks_[0].dways[w].data(), nc));
    }
    return absl::OkStatus();
  }

 private:
  struct Block {
    int64_t w1, w2, stat, k_norm, v_norm, ln_attn;
    Vec<T> ways[4], dways[4];  // this block's inputs X^Q, X^K, X^V, X^R and gradients
    Vec<T> normed[3];
    Vec<Acc> rstd[3];
    Vec<T> xa;                 // X_A
    Vec<T> r, h, g;            // the connection after this block
    Vec<Acc> r_rstd;
    Vec<Acc> a;  // its dynamic coefficients (N, ways * sources), the static not added
  };

  // Ways of the connection after block i, written into next's inputs (or x_final).
  absl::Status DenseConnection(int i, const Weights<B>& weights, Block* next, T* x_final) {
    Block& b = blocks_[i];
    const int c = Ways(i), s = i + 2, k = Hidden(c, s);
    Vec<T> ones;
    ones.assign(d_, T(1));
    SATDAR_RETURN_IF_ERROR(CheckSize(ones, d_));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, b.r.data(), b.r_rstd.data(),
                                               xj_[i + 1].data(), ones.data(), rows_, d_, eps_));
    SATDAR_RETURN_IF_ERROR(
        ops::MatmulForward(x_, b.h.data(), b.r.data(), weights.compute + b.w1, rows_, k, d_));
    SATDAR_RETURN_IF_ERROR(
        ops::GeluForward(x_, b.g.data(), b.h.data(), static_cast<int64_t>(b.h.size())));
    SATDAR_RETURN_IF_ERROR(
        layers_internal::LinearForwardAcc(x_, b.a.data(), b.g.data(), weights.compute + b.w2,
                                          rows_, c * s, k));
    outs_.assign(4, nullptr);  // with one way it is R (the final hidden state)
    for (int w = 0; w < c; ++w) outs_[w] = next ? next->ways[w].data() : x_final;
    SATDAR_RETURN_IF_ERROR(outs_.Publish(x_));
    SATDAR_RETURN_IF_ERROR(ops::DenseCombineForward(x_, outs_.data(), c, xs_.data(), s,
                                                    b.a.data(), c * s, weights.master + b.stat,
                                                    rows_, d_));
    return absl::OkStatus();
  }

  // Backward of the connection after block i from dways_ (published by the caller).
  absl::Status DenseConnectionBackward(int i, const Weights<B>& weights, Acc* grads) {
    Block& b = blocks_[i];
    const int c = Ways(i), s = i + 2, k = Hidden(c, s);
    // da: dA in Acc (for the static weights); on CUDA also rounded to T (da_t_) for the GEMMs,
    // on the CPU (Acc == T) da_ itself.
    const T* da = nullptr;
    if constexpr (B::kDevice) {
      SATDAR_RETURN_IF_ERROR(ops::DenseCombineBackward(
          x_, da_.data(), da_t_.data(), grads + b.stat, dxs_.data(), dways_.data(), c,
          xs_.data(), s, b.a.data(), c * s, weights.master + b.stat, rows_, d_));
      da = da_t_.data();
    } else {
      SATDAR_RETURN_IF_ERROR(ops::DenseCombineBackward(
          x_, da_.data(), grads + b.stat, dxs_.data(), dways_.data(), c, xs_.data(), s,
          b.a.data(), c * s, weights.master + b.stat, rows_, d_));
      da = da_.data();
    }
    // dh_ (rows, k) = da w2 (overwritten).
    SATDAR_RETURN_IF_ERROR(layers_internal::LinearBackward(
        x_, dh_.data(), grads + b.w2, da, b.g.data(), weights.compute + b.w2, rows_, c * s, k,
        /*overwrite=*/true));
    SATDAR_RETURN_IF_ERROR(ops::GeluBackward(x_, dh_.data(), dh_.data(), b.h.data(),
                                             static_cast<int64_t>(rows_) * k));
    // dr_ (rows, d) = dh_ w1 (overwritten: all of dr_).
    SATDAR_RETURN_IF_ERROR(layers_internal::LinearBackward(
        x_, dr_.data(), grads + b.w1, dh_.data(), b.r.data(), weights.compute + b.w1, rows_, k,
        d_, /*overwrite=*/true));
    // RMS without a gain: the gain gradient is discarded.
    Vec<T> ones;
    ones.assign(d_, T(1));
    SATDAR_RETURN_IF_ERROR(CheckSize(ones, d_));
    Vec<Acc> dgain;
    dgain.assign(d_, Acc(0));
    SATDAR_RETURN_IF_ERROR(CheckSize(dgain, d_));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(x_, dxj_[i + 1].data(), dgain.data(),
                                                dr_.data(), xj_[i + 1].data(), ones.data(),
                                                b.r_rstd.data(), rows_, d_));
    return absl::OkStatus();
  }

  // A buffer allocated inside a pass: on CUDA a failed allocation leaves it empty (the
  // AllocScope keeps the failure), so check before an op reads it. Always OK on the CPU.
  template <typename V>
  static absl::Status CheckSize(const V& v, int n) {
    if (v.size() == static_cast<size_t>(n)) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        absl::StrCat("MUDDFormer: could not allocate a buffer of ", n, " elements"));
  }

  const int layers_, d_;
  const double eps_;
  const typename B::Exec x_;
  std::vector<Block> blocks_;
  const int a_, b_;  // this pipeline stage's blocks [a_, b_)
  int rows_ = 0;
  std::vector<Vec<T>> xj_, dxj_;  // X_0..X_L (this stage's) and their gradients
  PtrList<const T*> xs_;          // X_j: xj_[j], or an earlier stage's, read in place
  PtrList<T*> dxs_;               // dxj_[j].data(), the ops' list of the X_j gradients
  PtrList<T*> outs_;              // the ways a connection writes (DenseConnection)
  PtrList<const T*> dways_;       // their gradients (BackwardRange, DenseConnectionBackward)
  Vec<T> y_, dxa_, dn_, dr_, dh_;
  Vec<Acc> da_;   // (N, 4 (L+1)): dA of a connection
  Vec<T> da_t_;   // da_ rounded to T for the GEMMs, CUDA only (empty on the CPU)
  Vec<T> dnormed_[3];
};

}  // namespace

void AddMuddFormerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                         int layer, ParamTable* table) {
  MuddFormer<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeMuddFormer(const ModelConfig& config, const Sharding& shard,
                                             const typename B::Exec& x) {
  return std::make_unique<MuddFormer<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeMuddFormer<Cpu<float>>(const ModelConfig&,
                                                                           const Sharding&,
                                                                           const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeMuddFormer<Cpu<double>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeMuddFormer<Cuda<float>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeMuddFormer<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
