#include "model/transformer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/matmul.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"

namespace satdar::model {

namespace cpu = core::cpu;

namespace {
std::string LayerName(int i, const char* suffix) {
  return absl::StrCat("model.layers.", i, ".", suffix);
}
}  // namespace

void AddTransformerParams(const ModelConfig& c, ParamTable* table) {
  const int64_t d = c.hidden_size, hs = c.head_size();
  const int64_t qd = c.num_attention_heads * hs, kd = c.num_key_value_heads * hs;
  const ParamInit normal = ParamInit::Normal(c.initializer_range);
  const ParamInit ones = ParamInit::Constant(1.0);
  table->Add("model.embed_tokens.weight", {c.vocab_size, d}, normal);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    table->Add(LayerName(i, "input_layernorm.weight"), {d}, ones);
    table->Add(LayerName(i, "self_attn.q_proj.weight"), {qd, d}, normal);
    table->Add(LayerName(i, "self_attn.k_proj.weight"), {kd, d}, normal);
    table->Add(LayerName(i, "self_attn.v_proj.weight"), {kd, d}, normal);
    table->Add(LayerName(i, "self_attn.o_proj.weight"), {d, qd}, normal);
    if (c.qk_norm) {
      table->Add(LayerName(i, "self_attn.q_norm.weight"), {hs}, ones);
      table->Add(LayerName(i, "self_attn.k_norm.weight"), {hs}, ones);
    }
    table->Add(LayerName(i, "post_attention_layernorm.weight"), {d}, ones);
    table->Add(LayerName(i, "mlp.gate_proj.weight"), {c.intermediate_size, d}, normal);
    table->Add(LayerName(i, "mlp.up_proj.weight"), {c.intermediate_size, d}, normal);
    table->Add(LayerName(i, "mlp.down_proj.weight"), {d, c.intermediate_size}, normal);
  }
  table->Add("model.norm.weight", {d}, ones);
  if (!c.tie_word_embeddings) table->Add("lm_head.weight", {c.vocab_size, d}, normal);
}

template <typename T>
Transformer<T>::Transformer(const ModelConfig& config, core::ThreadPool* pool)
    : config_(config), pool_(pool) {
  AddTransformerParams(config_, &table_);
  embed_off_ = table_.Offset("model.embed_tokens.weight");
  norm_off_ = table_.Offset("model.norm.weight");
  head_off_ = config_.tie_word_embeddings ? embed_off_ : table_.Offset("lm_head.weight");
}

template <typename T>
typename Transformer<T>::LayerParams Transformer<T>::Layer(T* base, int i) const {
  auto at = [&](const char* suffix) { return base + table_.Offset(LayerName(i, suffix)); };
  LayerParams p;
  p.ln1 = at("input_layernorm.weight");
  p.attn.wq = at("self_attn.q_proj.weight");
  p.attn.wk = at("self_attn.k_proj.weight");
  p.attn.wv = at("self_attn.v_proj.weight");
  p.attn.wo = at("self_attn.o_proj.weight");
  if (config_.qk_norm) {
    p.attn.q_norm = at("self_attn.q_norm.weight");
    p.attn.k_norm = at("self_attn.k_norm.weight");
  }
  p.ln2 = at("post_attention_layernorm.weight");
  p.mlp.gate = at("mlp.gate_proj.weight");
  p.mlp.up = at("mlp.up_proj.weight");
  p.mlp.down = at("mlp.down_proj.weight");
  return p;
}

template <typename T>
void Transformer<T>::Resize(int b, int t) {
  if (b == b_ && t == t_) return;
  b_ = b;
  t_ = t;
  const ModelConfig& c = config_;
  adims_ = AttentionDims{b, t, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                         c.head_size(), c.qk_norm, c.rms_norm_eps};
  mdims_ = MlpDims{b * t, c.hidden_size, c.intermediate_size};
  cpu::RopeTables(&cos_, &sin_, t, c.head_size(), c.rope_theta);
  const size_t n = static_cast<size_t>(b) * t, nc = n * c.hidden_size;
  inputs_.resize(n);
  targets_.resize(n);
  residual_.assign(c.num_hidden_layers + 1, std::vector<T>(nc));
  layers_.resize(c.num_hidden_layers);
  for (LayerActs& l : layers_) {
    l.ln1.resize(nc);
    l.ln1_rstd.resize(n);
    l.attn.Resize(adims_);
    l.mid.resize(nc);
    l.ln2.resize(nc);
    l.ln2_rstd.resize(n);
    l.mlp.Resize(mdims_);
  }
  lnf_.resize(nc);
  lnf_rstd_.resize(n);
  logits_.resize(n * c.vocab_size);
  losses_.resize(n);
  dres_.resize(nc);
  dnorm_.resize(nc);
  dsub_.resize(nc);
  ascratch_.Resize(adims_);
  mscratch_.Resize(mdims_);
}

template <typename T>
double Transformer<T>::Forward(const T* params, const int32_t* tokens, int b, int t) {
  Resize(b, t);
  const ModelConfig& c = config_;
  const int n = b * t, d = c.hidden_size;
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      inputs_[bi * t + ti] = tokens[bi * (t + 1) + ti];
      targets_[bi * t + ti] = tokens[bi * (t + 1) + ti + 1];
    }
  }
  T* p = const_cast<T*>(params);  // weights are only read in forward
  cpu::EmbeddingForward(residual_[0].data(), inputs_.data(), p + embed_off_, n, d, pool_);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerParams lp = Layer(p, i);
    LayerActs& a = layers_[i];
    const T* h = residual_[i].data();
    cpu::RmsNormForward(a.ln1.data(), a.ln1_rstd.data(), h, lp.ln1, n, d, c.rms_norm_eps, pool_);
    AttentionLayerForward(dsub_.data(), &a.attn, a.ln1.data(), lp.attn, adims_, cos_.data(),
                          sin_.data(), &ascratch_, pool_);
    for (size_t j = 0; j < a.mid.size(); ++j) a.mid[j] = h[j] + dsub_[j];
    cpu::RmsNormForward(a.ln2.data(), a.ln2_rstd.data(), a.mid.data(), lp.ln2, n, d,
                        c.rms_norm_eps, pool_);
    MlpForward(dsub_.data(), &a.mlp, a.ln2.data(), lp.mlp, mdims_, pool_);
    T* out = residual_[i + 1].data();
    for (size_t j = 0; j < a.mid.size(); ++j) out[j] = a.mid[j] + dsub_[j];
  }
  cpu::RmsNormForward(lnf_.data(), lnf_rstd_.data(), residual_.back().data(), p + norm_off_, n, d,
                      c.rms_norm_eps, pool_);
  cpu::MatmulForward(logits_.data(), lnf_.data(), p + head_off_, n, c.vocab_size, d, pool_);
  cpu::CrossEntropyForward(losses_.data(), logits_.data(), targets_.data(), n, c.vocab_size,
                           pool_);
  double sum = 0;
  for (T l : losses_) sum += static_cast<double>(l);
  return sum / n;
}

template <typename T>
void Transformer<T>::Backward(const T* params, T* grads, double loss_scale) {
  SATDAR_CHECK(b_ > 0) << "Backward before Forward";
  const ModelConfig& c = config_;
  const int n = b_ * t_, d = c.hidden_size;
  T* p = const_cast<T*>(params);
  // d loss / d logits, written over the logits.
  cpu::CrossEntropyBackward(logits_.data(), logits_.data(), targets_.data(),
                            static_cast<T>(loss_scale / n), n, c.vocab_size, pool_);
  std::fill(dnorm_.begin(), dnorm_.end(), T(0));
  cpu::MatmulBackward(dnorm_.data(), grads + head_off_, logits_.data(), lnf_.data(),
                      p + head_off_, n, c.vocab_size, d, pool_);
  std::fill(dres_.begin(), dres_.end(), T(0));
  cpu::RmsNormBackward(dres_.data(), grads + norm_off_, dnorm_.data(), residual_.back().data(),
                       p + norm_off_, lnf_rstd_.data(), n, d, pool_);
  // dres_ holds d loss / d h_i; each sublayer adds its branch's contribution.
  for (int i = c.num_hidden_layers - 1; i >= 0; --i) {
    LayerParams lp = Layer(p, i);
    LayerParams lg = Layer(grads, i);
    LayerActs& a = layers_[i];
    std::fill(dnorm_.begin(), dnorm_.end(), T(0));
    MlpBackward(dnorm_.data(), lg.mlp, dres_.data(), a.mlp, a.ln2.data(), lp.mlp, mdims_,
                &mscratch_, pool_);
    cpu::RmsNormBackward(dres_.data(), lg.ln2, dnorm_.data(), a.mid.data(), lp.ln2,
                         a.ln2_rstd.data(), n, d, pool_);
    std::fill(dnorm_.begin(), dnorm_.end(), T(0));
    AttentionLayerBackward(dnorm_.data(), lg.attn, dres_.data(), a.attn, a.ln1.data(), lp.attn,
                           adims_, cos_.data(), sin_.data(), &ascratch_, pool_);
    cpu::RmsNormBackward(dres_.data(), lg.ln1, dnorm_.data(), residual_[i].data(), lp.ln1,
                         a.ln1_rstd.data(), n, d, pool_);
  }
  cpu::EmbeddingBackward(grads + embed_off_, dres_.data(), inputs_.data(), n, d, pool_);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace satdar::model
