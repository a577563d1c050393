// model/transformer.h: the baseline Llama-style pre-norm decoder (MODELS.md section 2):
// embedding, L blocks of (RMSNorm, GQA attention with qk_norm and RoPE, residual, RMSNorm,
// SwiGLU, residual), final RMSNorm, tied or untied head, mean cross-entropy.
#ifndef SATDAR_MODEL_TRANSFORMER_H_
#define SATDAR_MODEL_TRANSFORMER_H_

#include <memory>
#include <vector>

#include "model/layers/attention.h"
#include "model/layers/mlp.h"
#include "model/model.h"

namespace satdar::model {

// Adds the baseline parameters (section 5 names, section 2 init) to `table`.
void AddTransformerParams(const ModelConfig& config, ParamTable* table);

template <typename T>
class Transformer : public Model<T> {
 public:
  Transformer(const ModelConfig& config, core::ThreadPool* pool);

  const ParamTable& params() const override { return table_; }
  const ModelConfig& config() const override { return config_; }
  double Forward(const T* params, const int32_t* tokens, int b, int t) override;
  void Backward(const T* params, T* grads, double loss_scale) override;

 private:
  struct LayerActs {
    std::vector<T> ln1, ln1_rstd;  // normed input of attention (B*T, C), (B*T)
    AttentionActs<T> attn;
    std::vector<T> mid;            // h' = h + a (B*T, C)
    std::vector<T> ln2, ln2_rstd;  // normed input of the MLP
    MlpActs<T> mlp;
  };
  struct LayerParams {
    T* ln1;
    AttentionWeights<T> attn;
    T* ln2;
    MlpWeights<T> mlp;
  };
  LayerParams Layer(T* base, int i) const;
  void Resize(int b, int t);

  ModelConfig config_;
  core::ThreadPool* pool_;
  ParamTable table_;
  int64_t embed_off_, norm_off_, head_off_;

  int b_ = 0, t_ = 0;
  AttentionDims adims_;
  MlpDims mdims_;
  std::vector<T> cos_, sin_;
  std::vector<int32_t> inputs_, targets_;  // (B*T)
  std::vector<std::vector<T>> residual_;   // L+1 of (B*T, C): h_0 .. h_L
  std::vector<LayerActs> layers_;
  std::vector<T> lnf_, lnf_rstd_, logits_, losses_;
  // Backward scratch.
  std::vector<T> dres_, dnorm_, dsub_;
  AttentionScratch<T> ascratch_;
  MlpScratch<T> mscratch_;
};

}  // namespace satdar::model

#endif  // SATDAR_MODEL_TRANSFORMER_H_
