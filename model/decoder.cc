#include "model/decoder.h"

#include <algorithm>

#include "core/check.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/matmul.h"
#include "core/ops/rmsnorm.h"

namespace satdar::model {

namespace cpu = core::cpu;

template <typename T>
DecoderModel<T>::DecoderModel(const ModelConfig& config, core::ThreadPool* pool,
                              std::unique_ptr<Branches<T>> branches,
                              std::unique_ptr<Topology<T>> topology)
    : config_(config), pool_(pool), branches_(std::move(branches)),
      topology_(std::move(topology)) {
  const ModelConfig& c = config_;
  const ParamInit normal = ParamInit::Normal(c.initializer_range);
  table_.Add("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, normal);
  branches_->AddGlobalParams(&table_);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    branches_->AddLayerParams(i, &table_);
    topology_->AddLayerParams(i, &table_);
  }
  table_.Add("model.norm.weight", {c.hidden_size}, ParamInit::Constant(1.0));
  topology_->AddFinalParams(&table_);
  if (!c.tie_word_embeddings) table_.Add("lm_head.weight", {c.vocab_size, c.hidden_size}, normal);
  branches_->Bind(table_);
  topology_->Bind(table_);
  embed_off_ = table_.Offset("model.embed_tokens.weight");
  norm_off_ = table_.Offset("model.norm.weight");
  head_off_ = c.tie_word_embeddings ? embed_off_ : table_.Offset("lm_head.weight");
}

template <typename T>
void DecoderModel<T>::Resize(int b, int t) {
  if (b == b_ && t == t_) return;
  b_ = b;
  t_ = t;
  const size_t n = static_cast<size_t>(b) * t, nc = n * config_.hidden_size;
  inputs_.resize(n);
  targets_.resize(n);
  h0_.resize(nc);
  x_final_.resize(nc);
  lnf_.resize(nc);
  lnf_rstd_.resize(n);
  logits_.resize(n * config_.vocab_size);
  losses_.resize(n);
  dnorm_.resize(nc);
  dx_final_.resize(nc);
  dh0_.resize(nc);
  branches_->Resize(b, t);
  topology_->Resize(static_cast<int>(n));
}

template <typename T>
double DecoderModel<T>::Forward(const T* params, const int32_t* tokens, int b, int t) {
  Resize(b, t);
  params_ = params;
  const ModelConfig& c = config_;
  const int n = b * t, d = c.hidden_size;
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      inputs_[bi * t + ti] = tokens[bi * (t + 1) + ti];
      targets_[bi * t + ti] = tokens[bi * (t + 1) + ti + 1];
    }
  }
  branches_->SetParams(params, nullptr);
  cpu::EmbeddingForward(h0_.data(), inputs_.data(), params + embed_off_, n, d, pool_);
  topology_->Forward(params, h0_.data(), branches_.get(), x_final_.data());
  cpu::RmsNormForward(lnf_.data(), lnf_rstd_.data(), x_final_.data(), params + norm_off_, n, d,
                      c.rms_norm_eps, pool_);
  cpu::MatmulForward(logits_.data(), lnf_.data(), params + head_off_, n, c.vocab_size, d, pool_);
  cpu::CrossEntropyForward(losses_.data(), logits_.data(), targets_.data(), n, c.vocab_size,
                           pool_);
  double sum = 0;
  for (T l : losses_) sum += static_cast<double>(l);
  cross_entropy_ = sum / n;
  return cross_entropy_ + branches_->aux_loss();
}

template <typename T>
void DecoderModel<T>::Backward(const T* params, T* grads, double loss_scale) {
  SATDAR_CHECK(b_ > 0) << "Backward before Forward";
  const ModelConfig& c = config_;
  const int n = b_ * t_, d = c.hidden_size;
  T* p = const_cast<T*>(params);
  cpu::CrossEntropyBackward(logits_.data(), logits_.data(), targets_.data(),
                            static_cast<T>(loss_scale / n), n, c.vocab_size, pool_);
  std::fill(dnorm_.begin(), dnorm_.end(), T(0));
  cpu::MatmulBackward(dnorm_.data(), grads + head_off_, logits_.data(), lnf_.data(),
                      p + head_off_, n, c.vocab_size, d, pool_);
  std::fill(dx_final_.begin(), dx_final_.end(), T(0));
  cpu::RmsNormBackward(dx_final_.data(), grads + norm_off_, dnorm_.data(), x_final_.data(),
                       p + norm_off_, lnf_rstd_.data(), n, d, pool_);
  branches_->SetParams(params, grads);
  branches_->BeginBackward(loss_scale);
  topology_->Backward(params, grads, dx_final_.data(), branches_.get(), dh0_.data());
  cpu::EmbeddingBackward(grads + embed_off_, dh0_.data(), inputs_.data(), n, d, pool_);
}

template <typename T>
void DecoderModel<T>::AppendStats(nlohmann::json* stats) const {
  branches_->AppendStats(stats);
  topology_->AppendStats(stats);
}

template <typename T>
void DecoderModel<T>::ResetStats() {
  branches_->ResetStats();
  topology_->ResetStats();
}

template <typename T>
bool DecoderModel<T>::SetGateAblation(GateAblation mode) {
  ValueResidual<T>* vr = branches_->value_residual();
  if (vr == nullptr) return mode == GateAblation::kNone;
  return vr->SetGateAblation(mode);
}

template <typename T>
void DecoderModel<T>::Predictions(std::vector<int32_t>* argmax) const {
  const int n = b_ * t_, v = config_.vocab_size;
  argmax->resize(n);
  for (int r = 0; r < n; ++r) {
    const T* row = logits_.data() + static_cast<size_t>(r) * v;
    (*argmax)[r] = static_cast<int32_t>(std::max_element(row, row + v) - row);
  }
}

template <typename T>
bool DecoderModel<T>::GateValues(int layer, std::vector<double>* gates) const {
  ValueResidual<T>* vr = branches_->value_residual();
  const T* g = vr == nullptr ? nullptr : vr->gate_values(layer);
  if (g == nullptr) return false;
  gates->assign(g, g + static_cast<size_t>(b_) * t_ * config_.num_key_value_heads);
  return true;
}

template class DecoderModel<float>;
template class DecoderModel<double>;

}  // namespace satdar::model
