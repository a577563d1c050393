#include "model/branches.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"

namespace satdar::model {

namespace cpu = core::cpu;

namespace {
std::string LayerName(int i, const char* suffix) {
  return absl::StrCat("model.layers.", i, ".", suffix);
}
}  // namespace

template <typename T>
Branches<T>::Branches(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool,
                      std::unique_ptr<ValueResidual<T>> value_residual,
                      std::unique_ptr<Ffn<T>> ffn)
    : config_(config), shard_(shard), pool_(pool), value_residual_(std::move(value_residual)),
      ffn_(std::move(ffn)), layers_(config.num_hidden_layers) {}

template <typename T>
void Branches<T>::AddGlobalParams(ParamTable* table) {
  if (value_residual_) value_residual_->AddGlobalParams(table);
}

template <typename T>
void Branches<T>::AddLayerParams(int i, ParamTable* table) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, hs = c.head_size();
  const int64_t qd = c.num_attention_heads * hs, kd = c.num_key_value_heads * hs;
  const ParamInit normal = ParamInit::Normal(c.initializer_range);
  const ParamInit ones = ParamInit::Constant(1.0);
  const int r = shard_.tp_rank, tp = shard_.tp_size;
  table->Add(LayerName(i, "input_layernorm.weight"), {d}, ones);
  // q, k and v back to back: the attention layer runs them as one GEMM. Under tensor
  // parallelism each rank holds its heads' rows (column-parallel) and Wo's matching columns
  // (row-parallel).
  table->AddShard(LayerName(i, "self_attn.q_proj.weight"), {qd, d}, normal, 0, r, tp);
  table->AddShard(LayerName(i, "self_attn.k_proj.weight"), {kd, d}, normal, 0, r, tp);
  table->AddShard(LayerName(i, "self_attn.v_proj.weight"), {kd, d}, normal, 0, r, tp);
  table->AddShard(LayerName(i, "self_attn.o_proj.weight"), {d, qd}, normal, 1, r, tp);
  if (c.qk_norm) {
    // Shared by all heads: each rank's gradient covers its heads only.
    table->Add(LayerName(i, "self_attn.q_norm.weight"), {hs}, ones).tp_partial_grad = tp > 1;
    table->Add(LayerName(i, "self_attn.k_norm.weight"), {hs}, ones).tp_partial_grad = tp > 1;
  }
  if (value_residual_) value_residual_->AddLayerParams(i, table);
  table->Add(LayerName(i, "post_attention_layernorm.weight"), {d}, ones);
  ffn_->AddLayerParams(i, table);
}

template <typename T>
void Branches<T>::Bind(const ParamTable& table) {
  for (int i = 0; i < config_.num_hidden_layers; ++i) {
    if (!Owned(i)) continue;
    Layer& l = layers_[i];
    l.ln_attn = table.Offset(LayerName(i, "input_layernorm.weight"));
    l.wq = table.Offset(LayerName(i, "self_attn.q_proj.weight"));
    l.wk = table.Offset(LayerName(i, "self_attn.k_proj.weight"));
    l.wv = table.Offset(LayerName(i, "self_attn.v_proj.weight"));
    l.wo = table.Offset(LayerName(i, "self_attn.o_proj.weight"));
    l.q_norm = config_.qk_norm ? table.Offset(LayerName(i, "self_attn.q_norm.weight")) : -1;
    l.k_norm = config_.qk_norm ? table.Offset(LayerName(i, "self_attn.k_norm.weight")) : -1;
    l.ln_mlp = table.Offset(LayerName(i, "post_attention_layernorm.weight"));
  }
  if (value_residual_) value_residual_->Bind(table);
  ffn_->Bind(table);
}

template <typename T>
void Branches<T>::Resize(int b, int t) {
  const ModelConfig& c = config_;
  // This tensor-parallel rank's heads.
  dims_ = AttentionDims{b,
                        t,
                        c.hidden_size,
                        shard_.TpCount(c.num_attention_heads),
                        shard_.TpCount(c.num_key_value_heads),
                        c.head_size(),
                        c.qk_norm,
                        c.rms_norm_eps};
  cpu::RopeTables(&cos_, &sin_, t, c.head_size(), c.rope_theta);
  const size_t n = static_cast<size_t>(b) * t, nc = n * c.hidden_size;
  const size_t nkv = n * dims_.nkv * c.head_size();
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!Owned(static_cast<int>(i))) continue;
    Layer& l = layers_[i];
    l.x_attn.resize(nc);
    l.rstd_attn.resize(n);
    l.attn.Resize(dims_);
    if (value_residual_ && i >= 1) l.vmix.resize(nkv);
    l.z_mlp.resize(nc);
    l.rstd_mlp.resize(n);
  }
  scratch_.Resize(dims_);
  dx_.resize(nc);
  dv_raw_.resize(nkv);
  if (value_residual_) {
    dv1_.resize(nkv);
    value_residual_->Resize(static_cast<int>(n));
  }
  ffn_->Resize(b, t);
}

template <typename T>
void Branches<T>::SetParams(const T* params, T* grads) {
  params_ = params;
  grads_ = grads;
}

template <typename T>
AttentionWeights<T> Branches<T>::Weights(T* base, const Layer& l) const {
  AttentionWeights<T> w{base + l.wq, base + l.wk, base + l.wv, base + l.wo, nullptr, nullptr};
  if (config_.qk_norm) {
    w.q_norm = base + l.q_norm;
    w.k_norm = base + l.k_norm;
  }
  return w;
}

template <typename T>
const T* Branches<T>::ValuesRead(int i) const {
  return (value_residual_ && i >= 1) ? layers_[i].vmix.data() : layers_[i].attn.v.data();
}

template <typename T>
void Branches<T>::Forward(int l, const T* u, T* y) {
  const int i = (l - 1) / 2;
  Layer& L = layers_[i];
  const int n = dims_.rows(), d = config_.hidden_size;
  if (l % 2 == 1) {
    cpu::RmsNormForward(L.x_attn.data(), L.rstd_attn.data(), u, params_ + L.ln_attn, n, d,
                        config_.rms_norm_eps, pool_);
    const T* x = L.x_attn.data();
    AttentionNormedForward(i, x, x, x, y);
  } else {
    cpu::RmsNormForward(L.z_mlp.data(), L.rstd_mlp.data(), u, params_ + L.ln_mlp, n, d,
                        config_.rms_norm_eps, pool_);
    L.aux = ffn_->Forward(i, params_, L.z_mlp.data(), y);
    if (ffn_->tp_partial()) TpAllReduce(shard_, y, static_cast<size_t>(n) * d);
  }
}

template <typename T>
void Branches<T>::Backward(int l, const T* u, const T* dy, T* du) {
  const int i = (l - 1) / 2;
  if (l % 2 == 0 && hook_ && i + 1 < config_.num_hidden_layers && Owned(i + 1)) hook_(i + 1);
  Layer& L = layers_[i];
  const int n = dims_.rows(), d = config_.hidden_size;
  std::fill(dx_.begin(), dx_.end(), T(0));
  if (l % 2 == 1) {
    const T* x = L.x_attn.data();
    AttentionNormedBackward(i, x, x, x, dy, dx_.data(), dx_.data(), dx_.data());
    cpu::RmsNormBackward(du, grads_ + L.ln_attn, dx_.data(), u, params_ + L.ln_attn,
                         L.rstd_attn.data(), n, d, pool_);
  } else {
    ffn_->Backward(i, params_, grads_, L.z_mlp.data(), dy, dx_.data(), loss_scale_);
    if (ffn_->tp_partial()) TpAllReduce(shard_, dx_.data(), dx_.size());
    cpu::RmsNormBackward(du, grads_ + L.ln_mlp, dx_.data(), u, params_ + L.ln_mlp,
                         L.rstd_mlp.data(), n, d, pool_);
  }
}

template <typename T>
void Branches<T>::AttentionNormedForward(int i, const T* xq, const T* xk, const T* xv, T* y) {
  Layer& L = layers_[i];
  AttentionWeights<T> w = Weights(const_cast<T*>(params_), L);
  AttentionProjectForward(&L.attn, xq, xk, xv, w, dims_, &scratch_, pool_);
  if (value_residual_ && i >= 1) {
    // The gate (SATFormer) reads the normed input of the values.
    value_residual_->Forward(i, params_, xv, L.attn.v.data(), v1(), L.vmix.data());
  }
  AttentionCoreForward(y, &L.attn, ValuesRead(i), w, dims_, cos_.data(), sin_.data(), pool_);
  TpAllReduce(shard_, y, static_cast<size_t>(dims_.rows()) * config_.hidden_size);  // row-parallel Wo
}

template <typename T>
void Branches<T>::AttentionNormedBackward(int i, const T* xq, const T* xk, const T* xv,
                                          const T* dy, T* dxq, T* dxk, T* dxv) {
  Layer& L = layers_[i];
  AttentionWeights<T> w = Weights(const_cast<T*>(params_), L);
  AttentionWeights<T> g = Weights(grads_, L);
  AttentionCoreBackward(g, dy, L.attn, ValuesRead(i), w, dims_, cos_.data(), sin_.data(),
                        &scratch_, pool_);
  const T* dv = scratch_.dv.data();  // d loss / d (values attention read)
  if (value_residual_ && i >= 1) {
    value_residual_->Backward(i, params_, grads_, xv, L.attn.v.data(), v1(), scratch_.dv.data(),
                              dxv, dv_raw_.data(), dv1_.data());
    dv = dv_raw_.data();
  } else if (value_residual_ && i == 0) {
    // Layer 1's V is also V1: add the gradient every later layer sent it.
    for (size_t e = 0; e < dv_raw_.size(); ++e) dv_raw_[e] = scratch_.dv[e] + dv1_[e];
    dv = dv_raw_.data();
    value_residual_->FinishBackward(params_, grads_);
  }
  AttentionProjectBackward(dxq, dxk, dxv, g, dv, xq, xk, xv, w, dims_, &scratch_, pool_);
  // Column-parallel q/k/v (and the gate rows): each rank's input gradients are partial sums,
  // added over the TP group once per distinct buffer.
  const size_t nc = static_cast<size_t>(dims_.rows()) * config_.hidden_size;
  TpAllReduce(shard_, dxq, nc);
  if (dxk != dxq) TpAllReduce(shard_, dxk, nc);
  if (dxv != dxq && dxv != dxk) TpAllReduce(shard_, dxv, nc);
}

template <typename T>
const T* Branches<T>::v1() const {
  return Owned(0) ? layers_[0].attn.v.data() : v1_in_;
}

template <typename T>
void Branches<T>::BeginBackward(double loss_scale) {
  loss_scale_ = loss_scale;
  std::fill(dv1_.begin(), dv1_.end(), T(0));
}

template <typename T>
double Branches<T>::aux_loss() const {
  double sum = 0;
  for (int i = 0; i < config_.num_hidden_layers; ++i) {
    if (Owned(i)) sum += layers_[i].aux;
  }
  return sum;
}

template <typename T>
void Branches<T>::AppendStats(nlohmann::json* stats) const {
  if (value_residual_) value_residual_->AppendStats(stats);
  ffn_->AppendStats(stats);
}

template <typename T>
void Branches<T>::ResetStats() {
  if (value_residual_) value_residual_->ResetStats();
  ffn_->ResetStats();
}

template class Branches<float>;
template class Branches<double>;

}  // namespace satdar::model
